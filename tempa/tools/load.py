"""Find the model a user points the CLI at, and its example inputs.

The convention (shown by ``tempa bench --help`` and examples/README.md):

    FILE.py defines
        model            an nn.Module or a function
        example_inputs   a tuple of positional arguments (a single tensor is accepted too)
        example_kwargs   optional: a dict of keyword arguments
        extra_inputs     optional: a list of further input tuples (other shapes) that
                         `tempa explain` and `tempa report` call after the first, to show
                         recompiles
    or FILE.py defines make() returning (model, example_inputs) or
        (model, example_inputs, example_kwargs).

    The target may also be a module name (``pkg.models``), ``module:attr`` or
    ``FILE.py:attr``, where attr is a make()-style function (or an object with the
    attributes above).

Every way this can go wrong raises TargetError with one line that names what is missing
and the convention; the CLI prints it and exits with status 2.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
import types
from dataclasses import dataclass, field

CONVENTION = ("FILE.py must define `model` (an nn.Module or function) and `example_inputs` "
              "(a tuple; optional `example_kwargs` dict), or a `make()` returning "
              "(model, example_inputs)")


class TargetError(Exception):
    """The user's target cannot be used; the message is one line, ready to print."""


@dataclass
class Target:
    spec: str
    model: object
    args: tuple
    kwargs: dict = field(default_factory=dict)
    extra_inputs: list = field(default_factory=list)   # list of (args, kwargs)
    filename: str | None = None

    @property
    def name(self) -> str:
        m = self.model
        if isinstance(m, types.FunctionType):
            return m.__qualname__
        return type(m).__name__

    def describe_inputs(self) -> str:
        parts = [describe(a) for a in self.args]
        parts += [f"{k}={describe(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts)

    def to(self, device: str) -> "Target":
        """The same target with the model and every tensor input moved to ``device``."""
        import torch
        if device == "cpu":
            return self
        if device == "cuda" and not torch.cuda.is_available():
            raise TargetError("--device cuda: CUDA is not available on this machine (torch "
                              f"{torch.__version__}); use --device cpu")
        mv = lambda v: _map_tensors(v, lambda t: t.to(device))  # noqa: E731
        model = self.model.to(device) if isinstance(self.model, torch.nn.Module) else self.model
        return Target(self.spec, model, mv(self.args), mv(self.kwargs),
                      [(mv(a), mv(k)) for a, k in self.extra_inputs], self.filename)


def describe(v) -> str:
    import torch
    if isinstance(v, torch.Tensor):
        dt = str(v.dtype).replace("torch.", "")
        dev = "" if v.device.type == "cpu" else f" {v.device}"
        return f"Tensor[{', '.join(map(str, v.shape))}] {dt}{dev}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(describe(x) for x in v[:4]) + (", ..." if len(v) > 4 else "")
        return f"[{inner}]" if isinstance(v, list) else f"({inner})"
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _map_tensors(v, f):
    import torch
    if isinstance(v, torch.Tensor):
        return f(v)
    if isinstance(v, tuple):
        return tuple(_map_tensors(x, f) for x in v)
    if isinstance(v, list):
        return [_map_tensors(x, f) for x in v]
    if isinstance(v, dict):
        return {k: _map_tensors(x, f) for k, x in v.items()}
    return v


def _where_raised(exc: BaseException, filename: str | None) -> str:
    """' (FILE:LINE)' for the deepest frame of the user's file in the traceback."""
    line = None
    for fs in traceback.extract_tb(exc.__traceback__):
        if filename and os.path.abspath(fs.filename) == os.path.abspath(filename):
            line = f" (line {fs.lineno})"
    return line or ""


def _one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0]}" if msg else type(exc).__name__


def _load_file(path: str, debug: bool) -> types.ModuleType:
    if not os.path.exists(path):
        raise TargetError(f"{path}: no such file. {CONVENTION}")
    if os.path.isdir(path):
        raise TargetError(f"{path} is a directory, not a Python file. {CONVENTION}")
    path = os.path.abspath(path)
    name = "__tempa_target_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"{path}: not a Python file. {CONVENTION}")
    module = importlib.util.module_from_spec(spec)
    # Like `python FILE.py`: the file's own directory is importable (sibling modules).
    sys.path.insert(0, os.path.dirname(path))
    sys.modules[name] = module   # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:
        raise TargetError(f"{path} called sys.exit({e.code}) while being loaded; keep the "
                          "script part under `if __name__ == \"__main__\":`") from None
    except BaseException as e:
        if debug or isinstance(e, KeyboardInterrupt):
            raise
        raise TargetError(f"{path} raised {_one_line(e)}{_where_raised(e, path)} while being "
                          "loaded; run with --debug for the traceback") from None
    return module


def _load_module(name: str, debug: bool) -> types.ModuleType:
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise TargetError(f"{name}: no such file or module. {CONVENTION}") from None
        if debug:
            raise
        raise TargetError(f"module {name} raised {_one_line(e)} while being imported; run "
                          "with --debug for the traceback") from None
    except BaseException as e:
        if debug or isinstance(e, KeyboardInterrupt):
            raise
        raise TargetError(f"module {name} raised {_one_line(e)} while being imported; run "
                          "with --debug for the traceback") from None


def load(spec: str, *, debug: bool = False) -> Target:
    """Load ``spec`` (FILE.py, FILE.py:attr, module or module:attr) into a Target."""
    path, attr = spec, None
    if ":" in spec and not os.path.exists(spec):
        path, attr = spec.rsplit(":", 1)
    is_file = path.endswith(".py") or os.sep in path or os.path.exists(path)
    module = _load_file(path, debug) if is_file else _load_module(path, debug)
    filename = getattr(module, "__file__", None)
    where = path
    if attr is not None:
        if not hasattr(module, attr):
            raise TargetError(f"{where} has no attribute `{attr}`. {CONVENTION}")
        source = getattr(module, attr)
        if callable(source) and not _is_model(source):
            return _from_make(spec, source, f"{where}:{attr}()", filename, debug)
        return _from_namespace(spec, source, where, filename)
    if hasattr(module, "model"):
        return _from_namespace(spec, module, where, filename)
    if callable(getattr(module, "make", None)):
        return _from_make(spec, module.make, f"{where}: make()", filename, debug)
    raise TargetError(f"{where} defines neither `model` nor `make()`. {CONVENTION}")


def _is_model(obj) -> bool:
    import torch
    return isinstance(obj, torch.nn.Module)


def _from_make(spec, make, where, filename, debug) -> Target:
    try:
        made = make()
    except BaseException as e:
        if debug or isinstance(e, KeyboardInterrupt):
            raise
        raise TargetError(f"{where} raised {_one_line(e)}{_where_raised(e, filename)}; run "
                          "with --debug for the traceback") from None
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise TargetError(f"{where} returned {type(made).__name__}, not (model, "
                          f"example_inputs) or (model, example_inputs, example_kwargs). "
                          f"{CONVENTION}")
    kwargs = made[2] if len(made) == 3 else {}
    return _build(spec, made[0], made[1], kwargs, [], where, filename)


def _from_namespace(spec, ns, where, filename) -> Target:
    if not hasattr(ns, "model"):
        raise TargetError(f"{where} does not define `model`. {CONVENTION}")
    if not hasattr(ns, "example_inputs"):
        raise TargetError(f"{where} defines `model` but not `example_inputs`. {CONVENTION}")
    return _build(spec, ns.model, ns.example_inputs, getattr(ns, "example_kwargs", None) or {},
                  getattr(ns, "extra_inputs", None) or [], where, filename)


def _as_args(inputs, what: str, where: str) -> tuple:
    import torch
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, list):
        return tuple(inputs)
    if isinstance(inputs, tuple):
        return inputs
    raise TargetError(f"{where}: `{what}` is a {type(inputs).__name__}; it must be a tuple of "
                      f"positional arguments, e.g. (torch.randn(8, 32),). {CONVENTION}")


def _build(spec, model, inputs, kwargs, extra, where, filename) -> Target:
    if not callable(model):
        raise TargetError(f"{where}: `model` is a {type(model).__name__}, not an nn.Module or "
                          f"function. {CONVENTION}")
    args = _as_args(inputs, "example_inputs", where)
    if not isinstance(kwargs, dict):
        raise TargetError(f"{where}: `example_kwargs` is a {type(kwargs).__name__}, not a dict")
    extras = []
    for i, e in enumerate(extra):
        if isinstance(e, dict):
            extras.append((args, e))
        else:
            extras.append((_as_args(e, f"extra_inputs[{i}]", where), dict(kwargs)))
    return Target(spec, model, args, dict(kwargs), extras, filename)


def check_eager(target: Target, debug: bool = False):
    """Run the model once eagerly; a model that fails here is the user's to fix."""
    try:
        return target.model(*target.args, **target.kwargs)
    except BaseException as e:
        if debug or isinstance(e, KeyboardInterrupt):
            raise
        raise TargetError(f"{target.name}(*example_inputs) raised {_one_line(e)}"
                          f"{_where_raised(e, target.filename)} in plain eager mode, before "
                          "tempa was involved; fix the model or its example inputs (--debug "
                          "shows the traceback)") from None
