"""One capture: the state shared by every frame of it (graph, guards, objects made inside).

The interpreter (``interpreter.py``) runs frames; this module answers the questions frames
ask: what is this value loaded from outside (and what must be guarded about it), what is
``obj.attr``, and what does calling this callable do (record a graph op, inline Python
code, or evaluate a pure function on constants).
"""
from __future__ import annotations

import builtins
import inspect
import types

import torch

from . import calls
from .breaks import Unsupported
from .graph import GraphBuilder
from .guards import is_constant_type
from .values import TensorVar, TensorMethod

# Tensor attributes read from the fake tensor's metadata (static under static shapes).
TENSOR_METADATA_ATTRS = {
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "is_sparse",
    "is_quantized", "is_mkldnn", "is_nested", "layout", "is_leaf", "requires_grad",
    "is_mps", "is_xpu",
}
_BUILTIN_METHOD = type([].append)
# Python modules whose attributes are not guarded: they are libraries, not user state.
_UNGUARDED_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools",
                              "itertools", "collections", "typing", "transformers",
                              "numpy", "warnings", "logging", "inspect", "dataclasses",
                              "contextlib", "enum", "copy", "abc", "types", "re")


class Tracer:
    def __init__(self, builder: GraphBuilder, *, fullgraph: bool = False, dynamic=None):
        self.builder = builder
        # Which input dims are symbolic: True (all), or {expression: dims}; plus any dims the
        # user marked with tempa.mark_dynamic.
        self.dynamic = dynamic
        self.guards = builder.guards
        self.fullgraph = fullgraph
        self._internal: dict[int, object] = {}      # objects created during capture
        # Our copies of the caller's lists/dicts: id(copy) -> (copy, expression of the original)
        self.external_copies: dict[int, tuple] = {}
        self._copy_of: dict[int, tuple] = {}   # id(original) -> (original, copy, expression)
        self.param_ids: set[int] = set()
        self.depth = 0
        self.instructions_run = 0
        self.attr_writes: dict[tuple[int, str], tuple] = {}  # (id, name) -> (obj, name, value)
        self.paths: dict[int, str] = {}   # id(module) -> "self.h.0.attn", for readable names

    # -- internal objects -------------------------------------------------------------
    def mark_internal(self, obj):
        self._internal[id(obj)] = obj
        return obj

    def is_internal(self, obj) -> bool:
        return self._internal.get(id(obj)) is obj

    # -- values entering from outside the captured code -----------------------------
    def external(self, value, expr: str, *, user: bool = True):
        """Wrap ``value`` read at ``expr`` (an expression valid in the guard function) and
        record what the graph assumes about it."""
        if isinstance(value, torch.Tensor):
            if user:
                return self.builder.user_input(value, expr, self.dynamic_dims(value, expr))
            self.guards.identity(expr, value, expr)
            return self.builder.attr_input(value, expr)
        if is_constant_type(value):
            self.guards.constant(expr, value)
            return value
        t = type(value)
        if t is list or t is dict:
            copied = self._copy_of.get(id(value))
            if copied is not None and copied[0] is value:
                # The same list/dict reached twice (`out` and `out.append.__self__`): one
                # copy, so `is` answers as in eager, and a guard that they stay one object.
                self.guards.add("length", f"{expr} is {copied[2]}", f"{expr} is {copied[2]}")
                return copied[1]
        if t is tuple or t is list:
            self.guards.add("length", f"{expr}.__class__ is {self.guards.const(t, 'T')} and "
                            f"len({expr}) == {len(value)}", f"{expr} is a {t.__name__} of "
                            f"length {len(value)}")
            items = [self.external(v, f"{expr}[{i}]", user=user) for i, v in enumerate(value)]
            if t is tuple:
                return tuple(items)
            self.external_copies[id(items)] = (items, expr)
            self._copy_of[id(value)] = (value, items, expr)
            return items
        if t is dict:
            keys = tuple(value.keys())
            if all(isinstance(k, str) for k in keys):
                self.guards.add("length", f"{expr}.__class__ is {self.guards.const(t, 'T')} and "
                                f"tuple({expr}) == {self.guards.const(keys, 'K')}",
                                f"{expr} is a dict with keys {keys}")
                copy = {k: self.external(v, f"{expr}[{k!r}]", user=user) for k, v in value.items()}
                self.external_copies[id(copy)] = (copy, expr)
                self._copy_of[id(value)] = (value, copy, expr)
                return copy
        owner = getattr(value, "__self__", None)
        if t is _BUILTIN_METHOD and type(owner) in (list, dict):
            # `out.append` passed in (a resume function's argument): a new bound method on
            # every call, so guard its list instead, and call it on our copy of that list
            # (where a mutation is a graph break, never a change made once at capture).
            self.guards.add("constant", f"{expr}.__class__ is {self.guards.const(t, 'T')} and "
                            f"{expr}.__name__ == {value.__name__!r}", f"{expr} is "
                            f"{type(owner).__name__}.{value.__name__} of {expr}.__self__")
            return getattr(self.external(owner, f"{expr}.__self__", user=user), value.__name__)
        if isinstance(value, torch.nn.Module):
            self.guards.identity(expr, value, expr)
            self.builder.modules[id(value)] = value
            return value
        if isinstance(value, types.ModuleType) and value.__name__.startswith(_UNGUARDED_MODULE_PREFIXES):
            return value
        self.guards.identity(expr, value, expr)
        return value

    def dynamic_dims(self, tensor: torch.Tensor, expr: str) -> set:
        if self.builder.sizes is None:
            return set()
        dims = set(getattr(tensor, "_tempa_dynamic_dims", ()))
        if self.dynamic is True:
            dims |= set(range(tensor.dim()))
        elif isinstance(self.dynamic, dict):
            dims |= set(self.dynamic.get(expr, ()))
        return dims - set(getattr(tensor, "_tempa_static_dims", ()))

    def expr_of(self, obj) -> str:
        """An expression for a fixed object: the object itself, bound as a constant."""
        return self.guards.const(obj)

    # -- attributes ------------------------------------------------------------------
    def load_attr(self, obj, name: str, frame):
        if self.attr_writes:
            written = self.attr_writes.get((id(obj), name))
            if written is not None and written[0] is obj:
                return written[2]
        if isinstance(obj, TensorVar):
            return self.tensor_attr(obj, name)
        if self.is_internal(obj) or obj.__class__ in (list, tuple, dict) or \
                id(obj) in self.external_copies or _method_of_copy(self, obj):
            return self._static_or_concrete(obj, name, frame, guard=False)
        if isinstance(obj, torch.nn.Module):
            return self.module_attr(obj, name, frame)
        if isinstance(obj, types.ModuleType):
            value = getattr(obj, name)
            if obj.__name__.startswith(_UNGUARDED_MODULE_PREFIXES):
                return value if not isinstance(value, torch.Tensor) else \
                    self.external(value, f"{self.expr_of(obj)}.{name}", user=False)
            return self.external(value, f"{self.expr_of(obj)}.{name}", user=False)
        return self._static_or_concrete(obj, name, frame, guard=True)

    def _static_or_concrete(self, obj, name, frame, *, guard: bool):
        # Properties and Python-level descriptors run their Python code in the interpreter
        # (they may touch tensors); everything else is read directly.
        try:
            static = inspect.getattr_static(obj, name)
        except AttributeError:
            static = None
        if isinstance(static, property) and static.fget is not None and \
                isinstance(static.fget, types.FunctionType):
            return frame.call(static.fget, [obj], {})
        if isinstance(static, types.FunctionType) and not (isinstance(obj, type)):
            inst_dict = getattr(obj, "__dict__", None)
            if not (isinstance(inst_dict, dict) and name in inst_dict):
                return types.MethodType(static, obj)
        if isinstance(static, (classmethod,)) and isinstance(static.__func__, types.FunctionType):
            return types.MethodType(static.__func__, obj if isinstance(obj, type) else type(obj))
        if isinstance(static, staticmethod):
            return static.__func__
        value = getattr(obj, name)  # may raise AttributeError: the frame handles it
        if not guard or callable(value) and not isinstance(value, torch.Tensor) and \
                inspect.isroutine(value):
            return value
        return self.external(value, f"{self.expr_of(obj)}.{name}", user=False)

    def module_attr(self, mod: torch.nn.Module, name: str, frame):
        d = mod.__dict__
        params = d.get("_parameters")
        if params is not None and name in params:
            p = params[name]
            if p is None:
                return None
            self.param_ids.add(id(p))
            return self.builder.attr_input(p, f"{self.path_of(mod)}.{name}")
        buffers = d.get("_buffers")
        if buffers is not None and name in buffers:
            b = buffers[name]
            if b is None:
                return None
            return self.builder.attr_input(b, f"{self.path_of(mod)}.{name}")
        modules = d.get("_modules")
        if modules is not None and name in modules:
            sub = modules[name]
            if sub is not None:
                self.builder.modules[id(sub)] = sub
                self.paths.setdefault(id(sub), f"{self.path_of(mod)}.{name}")
            return sub
        if name in d:
            value = d[name]
            if isinstance(value, torch.Tensor):
                self.guards.identity(f"{self.expr_of(mod)}.{name}", value)
                return self.builder.attr_input(value, f"{self.path_of(mod)}.{name}")
            return self.external(value, f"{self.expr_of(mod)}.{name}", user=False)
        return self._static_or_concrete(mod, name, frame, guard=True)

    def tensor_attr(self, t: TensorVar, name: str):
        fake = t.fake
        if name in TENSOR_METADATA_ATTRS:
            if name == "requires_grad" and t.node.op == "placeholder":
                # Reading requires_grad of an input: the graph depends on it.
                pass
            return getattr(fake, name)
        if name == "T":
            return self.builder.call("call_method", "permute", (t, *reversed(range(fake.dim()))), {})
        if name == "mT":
            return self.builder.call("call_method", "transpose", (t, -2, -1), {})
        if name == "data":
            return self.builder.call("call_method", "detach", (t,), {})
        if name in ("real", "imag", "H", "mH"):
            return self.builder.call("call_function", getattr, (t, name), {})
        if name in ("grad", "grad_fn", "_version", "untyped_storage", "data_ptr", "_base"):
            if name in ("data_ptr", "untyped_storage"):
                raise Unsupported("data-dependent value", f"tensor.{name} needs the real storage")
            raise Unsupported("unsupported construct", f"reading tensor.{name} inside a graph")
        if hasattr(torch.Tensor, name):
            return TensorMethod(t, name)
        raise AttributeError(f"'Tensor' object has no attribute '{name}'")

    def path_of(self, mod) -> str:
        return self.paths.get(id(mod), type(mod).__name__)

    # -- calls -----------------------------------------------------------------------
    def call(self, frame, fn, args: list, kwargs: dict):
        return calls.call(self, frame, fn, args, kwargs)


def _method_of_copy(tracer, obj) -> bool:
    """``out.append`` of our copy of a caller's list: its attributes (``__self__``) are ours."""
    return type(obj) is _BUILTIN_METHOD and id(getattr(obj, "__self__", None)) in \
        tracer.external_copies


def builtin(name: str):
    return getattr(builtins, name)
