"""Calling a class during capture: what ``cls(*args, **kwargs)`` builds.

Builtin types go to their models (``calls_builtins.py``), grad-mode and autocast contexts
to ``context.py``, torch's own value classes (``torch.Size``, ``torch.device``) and plain
C classes known to be pure are built now; a class with Python ``__new__``/``__init__`` is
built by tracing them (``_instantiate``), a module built in forward too (``_new_module``).
The object made is one of this capture (``tracer.mark_internal``): its writes are not
side effects on outside state. Used by ``calls.py``; calls back into it through
``tracer.call``.
"""
from __future__ import annotations

import functools
import types

import torch

from . import context, stdlib
from .breaks import Unsupported
from .calls_builtins import _BUILTIN_TYPES, _builtin_type
from .calls_inline import inline
from .purity import _PURE_C_CLASSES, _PURE_C_MODULES, _PURE_C_TYPES, _check_pure_arguments
from .values import contains_tensor


def call_class(tracer, frame, cls: type, args, kwargs):
    if cls in _BUILTIN_TYPES:
        tracer.identity_used(*args, *(args[0] if cls in (set, frozenset) and args and
                                      isinstance(args[0], (list, tuple)) else ()))
        return _builtin_type(tracer, frame, cls, args, kwargs)
    if cls in context.GRAD_CONTEXT_CLASSES or cls in context.PROFILER_LABEL_CLASSES or \
            context.is_autocast_class(cls):
        return context.make(tracer, cls, args, kwargs)
    if issubclass(cls, torch.Tensor):
        raise Unsupported("unsupported call", f"constructing {cls.__name__} inside a graph")
    if issubclass(cls, torch.nn.Module):
        return _new_module(tracer, frame, cls, args, kwargs)
    mod = cls.__module__ or ""
    if mod == "torch.return_types":
        return stdlib.structseq(tracer, frame, cls, args, kwargs)
    if mod.startswith("torch") and not hasattr(cls, "__dataclass_fields__") and \
            not mod.startswith("torch.distributions") and not _python_init(cls):
        if _stores_items(cls, args, kwargs):   # torch.fx's immutable_list(...), immutable_dict
            return tracer.mark_internal(cls(*args))
        if contains_tensor(args) or contains_tensor(kwargs):
            raise Unsupported("unsupported call", f"{cls.__name__}(tensor)")
        return cls(*args, **kwargs)  # torch.Size, torch.device, torch.finfo, ...
    if issubclass(cls, BaseException) or cls.__init__ is object.__init__ and \
            cls.__new__ is object.__new__:
        if contains_tensor(args) or contains_tensor(kwargs):
            raise Unsupported("unsupported call", f"{cls.__name__}(tensor)")
        return tracer.mark_internal(cls(*args, **kwargs))
    new = cls.__new__
    if not isinstance(new, types.FunctionType) and not isinstance(cls.__init__, types.FunctionType):
        # A C-level class (functools.partial, collections.OrderedDict, ...): it only stores
        # its arguments, tensors included. Others (io.StringIO, numpy arrays) hold state
        # tempa cannot see into.
        if not (issubclass(cls, _PURE_C_TYPES) or cls.__module__ in _PURE_C_MODULES or
                f"{cls.__module__}.{cls.__qualname__}" in _PURE_C_CLASSES):
            raise Unsupported("non-torch library call", f"{cls.__module__}.{cls.__qualname__}() "
                              "builds an object whose C code is not known to be pure")
        _check_pure_arguments(args, kwargs, f"{cls.__qualname__}()")
        if (contains_tensor(args) or contains_tensor(kwargs)) and not issubclass(
                cls, (functools.partial, dict, list, tuple, set, *stdlib.STORING_CLASSES)):
            raise Unsupported("unsupported call", f"{cls.__qualname__}(tensor)")
        for arg in (*args, *kwargs.values()):
            tracer.contents_read_by_c(arg)   # OrderedDict(out): an output record's items
        return tracer.mark_internal(cls(*args, **kwargs))
    return _instantiate(tracer, frame, cls, args, kwargs)


def _python_init(cls: type) -> bool:
    """A class whose ``__init__`` is Python code of its own (not ``object``'s or C's): an
    object of it holds state its code changes (torch.func.functional_call's
    NamedMemberAccessor memoises submodules). Built for real at capture, it was one object
    shared by every call, its state guarded as the caller's: each call's writes into it
    made the next call recapture. Traced, it is made anew on every call, as in eager."""
    return isinstance(cls.__init__, types.FunctionType)


def _stores_items(cls: type, args, kwargs) -> bool:
    """``cls(items)`` for a list or dict subclass whose construction is list's or dict's
    own C code: it only stores the items of a list, tuple or dict made or copied by this
    capture (tensors included), running no code of the program."""
    return issubclass(cls, (list, dict)) and not kwargs and len(args) == 1 and \
        type(args[0]) in (list, tuple, dict) and \
        all(getattr(cls, m) is getattr(base, m) for base in (list, dict) if issubclass(cls, base)
            for m in ("__new__", "__init__"))


def _instantiate(tracer, frame, cls: type, args, kwargs):
    """``cls(*args, **kwargs)`` for a class with Python ``__new__``/``__init__``: traced."""
    new = cls.__new__
    if isinstance(new, types.FunctionType) or isinstance(new, staticmethod):
        obj = tracer.call(frame, new, [cls, *args], kwargs)
    else:
        obj = new(cls)
    tracer.mark_internal(obj)
    init = cls.__init__
    if isinstance(init, types.FunctionType):
        inline(tracer, frame, init, [obj, *args], kwargs)
    elif init is not object.__init__:
        # a C __init__ (an OrderedDict subclass filled from tensors): it just stores them
        for arg in (*args, *kwargs.values()):
            tracer.contents_read_by_c(arg)   # (an output record's items, read by C)
        init(obj, *args, **kwargs)
    return obj


def _new_module(tracer, frame, cls, args, kwargs):
    """A module built in forward (``nn.Softmax(dim=-1)(x)``): built as Python builds it,
    its ``__init__`` traced, then called like any module. One with parameters or buffers
    is refused: eager makes new ones (new random weights) on every call."""
    mod = _instantiate(tracer, frame, cls, args, kwargs)
    if any(True for _ in mod.parameters()) or any(True for _ in mod.buffers()):
        raise Unsupported("module created in forward", f"creating a {cls.__name__} module with "
                                                       "parameters or buffers in forward")
    return mod
