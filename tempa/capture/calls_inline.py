"""Calling Python code during capture: inlining it into the caller's graph.

``inline`` runs a function's code in a child ``Frame`` (``_child_frame``: its arguments
bound as CPython binds them, ``bind_arguments``, its code guarded), so its torch operations
and guards join the graph; a generator function's frame becomes a ``GeneratorRun`` that
runs one ``yield`` at a time. Code that must run as it is (``tempa.disable``,
``torch.compiler.disable``, the autograd engine, tempa's own code) is refused here, with
the reason, so the call runs in Python. Used by ``calls.py`` (the dispatcher) and by the
code that calls a class (``calls_classes.py``).
"""
from __future__ import annotations

import sys
import types

import torch

from . import cache, higher_order
from .breaks import Unsupported
from .generator_run import GeneratorRun
from .module_guards import guard_function
from .values import CapturedIter

# Code objects of functions marked @tempa.disable (filled by the api layer).
DISABLED_CODES: set = set()

_CO_GENERATOR, _CO_COROUTINE, _CO_ASYNC_GEN = 0x20, 0x80, 0x200
_INLINE_DEPTH_LIMIT = 48

# torch's own "never compile this" marks: torch._dynamo.disable's wrapper, and the lazy
# torch._disable_dynamo one (Optimizer.zero_grad); and the autograd engine's entry points.
_TORCH_DISABLE_CODE = torch._disable_dynamo(lambda: None).__code__
_AUTOGRAD_ENTRY_POINTS = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}


def runs_uncompiled(fn) -> bool:
    """A function that runs as it is, also when a graph-break runner calls it: one marked
    torch.compiler.disable, a user autograd Function's apply (higher_order.py), the
    autograd engine's entry points, tempa's own code."""
    return higher_order.runs_as_is(fn) or \
        getattr(fn, "__code__", None) is _TORCH_DISABLE_CODE or fn in _AUTOGRAD_ENTRY_POINTS or \
        _is_tempa_code(fn)


def inline(tracer, frame, fn: types.FunctionType, args, kwargs):
    # the originals of what torch.compile's first call patched for its own tracer
    fn = higher_order.unpatched_optimizer_method(fn) or higher_order.untagged_module_method(fn) \
        or fn
    code = fn.__code__
    higher_order.check_not_disabled(fn)   # its own message: marked torch.compiler.disable
    if _is_tempa_code(fn):
        return _tempa_code(tracer, fn, args)
    if runs_uncompiled(fn):
        raise Unsupported("disabled by tempa.disable", f"{fn.__qualname__} runs uncompiled "
                          "(torch.compiler.disable, or the autograd engine)")
    if code in DISABLED_CODES:
        raise Unsupported("disabled by tempa.disable", f"{fn.__qualname__} is marked @tempa.disable")
    if code.co_flags & (_CO_COROUTINE | _CO_ASYNC_GEN):
        raise Unsupported("async code", f"{fn.__qualname__} is a coroutine")
    if tracer.depth >= _INLINE_DEPTH_LIMIT:
        raise Unsupported("call depth", "calls nested too deeply (recursion?)")
    child = _child_frame(tracer, frame, fn, args, kwargs)
    if child.is_generator:   # its body runs as it is iterated, one yield at a time
        return CapturedIter([], source=GeneratorRun(child))
    tracer.depth += 1
    try:
        return child.run()
    finally:
        tracer.depth -= 1


def _child_frame(tracer, frame, fn: types.FunctionType, args, kwargs):
    """The frame of a call of ``fn`` (its arguments bound, its code guarded), not yet run."""
    from .interpreter import Frame  # the two modules call each other
    if not tracer.is_internal(fn) and not _is_library_function(fn) and \
            id(fn) not in tracer.external_copies:   # a copy's code is guarded at its source
        guard_function(tracer.guards, fn)
    bound = bind_arguments(fn, args, kwargs, tracer=None if tracer.is_internal(fn) else tracer)
    return Frame(tracer, fn.__code__, fn.__globals__, bound, fn.__closure__,
                 name=fn.__qualname__, parent=frame,
                 is_generator=bool(fn.__code__.co_flags & _CO_GENERATOR))


def start_generator(tracer, frame, fn, args, kwargs):
    """The generator ``fn(*args, **kwargs)`` returns, as a ``GeneratorRun`` whose code runs
    one ``yield`` at a time when asked (``@contextmanager``'s generator)."""
    if not (isinstance(fn, types.FunctionType) and fn.__code__.co_flags & _CO_GENERATOR):
        raise Unsupported("context manager",
                          f"@contextmanager over "
                          f"{getattr(fn, '__qualname__', fn)!r}, which is not a Python generator")
    if fn.__code__ in DISABLED_CODES:
        raise Unsupported("disabled by tempa.disable", f"{fn.__qualname__} is marked @tempa.disable")
    if _is_tempa_code(fn):
        raise _uncaptured_tempa_code(fn)
    return GeneratorRun(_child_frame(tracer, frame, fn, args, kwargs))


# -- tempa's own code, reached by the captured code --------------------------------------
# Torch calls tempa's hooks back from code that capture traces (Module.register_buffer calls
# cache.py's invalidation hook). Tracing them would read, and guard, tempa's bookkeeping:
# its registries change as entries are added, so such an entry misses on every call. They
# are never traced: a hook whose effect capture knows is modelled, anything else of tempa's
# runs in Python, as it is (a graph break). runtime.py's helpers are the exception: resume
# functions call them, and they are written to be captured like the user's code.
def _is_tempa_code(fn) -> bool:
    if not isinstance(fn, types.FunctionType):
        return False
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    return module is not None and module.__name__.partition(".")[0] == _TEMPA_PACKAGE and \
        module.__dict__ is fn.__globals__ and module.__name__ not in _CAPTURED_TEMPA_MODULES


_TEMPA_PACKAGE = __name__.partition(".")[0]
_CAPTURED_TEMPA_MODULES = {f"{__package__}.runtime"}


def _tempa_code(tracer, fn: types.FunctionType, args):
    model = _TEMPA_CODE_MODELS.get(fn)
    if model is None:
        raise _uncaptured_tempa_code(fn)
    return model(tracer, *args)


def _uncaptured_tempa_code(fn: types.FunctionType) -> Unsupported:
    return Unsupported("unsupported call", f"{fn.__module__}.{fn.__qualname__} is tempa's own "
                       "code: it runs as it is, uncaptured")


def _registration_hook(tracer, module, name, value):
    """cache.py's invalidation hook, which torch calls when a module registers a parameter,
    buffer or submodule. A module this call built (``nn.CrossEntropyLoss()`` in forward) is
    watched by no entry: eager's hook does nothing, nor does the graph. A registration on
    a module from outside must drop the entries that read it, so it runs eagerly."""
    if tracer.is_internal(module):
        return None
    raise Unsupported("mutation of outside state", f"registering {name!r} on a "
                      f"{type(module).__name__} from outside the compiled call")


_TEMPA_CODE_MODELS = {cache._on_registration: _registration_hook}


def _is_library_function(fn) -> bool:
    """A function of a real library module (torch, ...): its code is not user state."""
    from .outside import is_library_module
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    return mod is not None and is_library_module(mod) and fn.__globals__ is mod.__dict__


def bind_arguments(fn, args, kwargs, tracer=None) -> dict:
    """Bind a call's arguments to ``fn``'s parameter names as CPython does (the names the
    code uses: a comprehension's implicit ``.0`` included, which inspect renames). With a
    ``tracer``, a default value used is read from its source (``f.__defaults__[i]``), so a
    default tensor is an input read on every call and a default list is guarded."""
    code = fn.__code__
    names = code.co_varnames
    npos, nkw, nposonly = code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount
    has_varargs, has_varkw = bool(code.co_flags & 0x04), bool(code.co_flags & 0x08)
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__ or {}
    pos_names = names[:npos]
    kw_names = names[npos:npos + nkw]

    def error(msg):
        from .breaks import UserError
        return UserError(TypeError(f"{fn.__qualname__}() {msg}"))

    if len(args) > npos and not has_varargs:
        raise error(f"takes {npos} positional arguments but {len(args)} were given")
    out = dict(zip(pos_names, args))
    i = npos + nkw
    if has_varargs:
        out[names[i]] = tuple(args[npos:])
        i += 1
    extra = {}
    for k, v in kwargs.items():
        if (k in pos_names and pos_names.index(k) >= nposonly) or k in kw_names:
            if k in out:
                raise error(f"got multiple values for argument '{k}'")
            out[k] = v
        elif has_varkw:
            extra[k] = v
        else:
            raise error(f"got an unexpected keyword argument '{k}'")
    first_default = npos - len(defaults)
    for j, name in enumerate(pos_names):
        if name not in out:
            if j < first_default:
                raise error(f"missing required positional argument: '{name}'")
            out[name] = defaults[j - first_default] if tracer is None else tracer.external(
                defaults[j - first_default], f"{tracer.expr_of(fn)}.__defaults__[{j - first_default}]",
                user=False)
    for name in kw_names:
        if name not in out:
            if name not in kwdefaults:
                raise error(f"missing required keyword-only argument: '{name}'")
            out[name] = kwdefaults[name] if tracer is None else tracer.external(
                kwdefaults[name], f"{tracer.expr_of(fn)}.__kwdefaults__[{name!r}]", user=False)
    if has_varkw:
        out[names[i]] = extra
    return out
