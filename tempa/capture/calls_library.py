"""Calling C and library code that is neither a torch op nor Python code.

``call_c`` decides whether such a callable (a builtin function, a method of a C type, an
instance with a ``__call__``) may run now, on the values capture holds: only where its
code is known to be pure (``purity.py``'s allow-lists) and its arguments are constants or
stored opaquely (a list's ``append`` of a tensor); a method that changes an object from
outside the call is a side effect (``_check_method_owner``); logging, ``print`` and unknown
C code break the graph. Also ``copy.copy``/``copy.deepcopy`` (``_copy``). Used by
``calls.py``; calls back into it through ``tracer.call``.
"""
from __future__ import annotations

import builtins
import collections
import copy
import functools
import logging
import types
import warnings

from . import shapes, stdlib
from .breaks import Unsupported
from .calls_builtins import _PLAIN_ITERABLES
from .purity import _BUILTIN_FUNCTION, _IMPURE_BUILTINS, _PLAIN_TYPES, _PURE_C_MODULES, \
    _check_pure_arguments, _check_pure_owner
from .values import TensorVar, bound_self, contains_tensor

_MUTATING_METHODS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                     "update", "setdefault", "popitem", "__setitem__", "__delitem__", "add",
                     "discard", "__iadd__", "__setattr__", "__delattr__", "appendleft",
                     "extendleft", "popleft", "rotate", "move_to_end"}
_STORING_METHODS = {"append", "extend", "insert", "__setitem__", "update", "setdefault", "get",
                    "pop", "__getitem__", "copy", "keys", "values", "items", "__init__",
                    "__len__", "index", "count", "add", "fromkeys", "__contains__", "remove"}
_METHOD_DESCRIPTOR = type(str.join)
_WRAPPER_DESCRIPTORS = (type(object.__init__), type(object().__str__), type(dict.__dict__["fromkeys"]))


def _key(fn):
    try:
        hash(fn)
        return fn
    except TypeError:
        return None


def call_c(tracer, frame, fn, args, kwargs):
    """A callable that is neither Python code nor a torch op."""
    model = stdlib.INSTANCE_MODELS.get(type(fn))
    if model is not None:   # operator.itemgetter(...) and the like
        return model(tracer, frame, fn, args, kwargs)
    if fn in _IMPURE_BUILTINS if _key(fn) is not None else False:
        kind = "print / side effect" if fn is builtins.print else "unsupported call"
        raise Unsupported(kind, f"{getattr(fn, '__name__', fn)}() has effects outside the graph")
    owner = bound_self(fn)
    if isinstance(owner, logging.Logger):
        return _logger_call(owner, fn, args)
    if isinstance(fn, functools._lru_cache_wrapper):
        if contains_tensor(args) or contains_tensor(kwargs):
            # The message quotes torch.compile's own warning so that a user's warning filter
            # written for torch.compile (matched on its text) works unchanged with tempa.
            warnings.warn(f"tempa: a call to the functools.lru_cache-wrapped function "
                          f"{getattr(fn, '__qualname__', fn)} is captured by running its body; "
                          "its cache is neither read nor filled by the compiled code "
                          "(torch.compile warns the same: \"Dynamo detected a call to a "
                          "`functools.lru_cache`-wrapped function\")",
                          stacklevel=2)
            return tracer.call(frame, fn.__wrapped__, args, kwargs)
        return fn(*args, **kwargs)
    _check_pure_arguments(args, kwargs, f"{getattr(fn, '__name__', fn)}()")
    if type(fn) is _BUILTIN_FUNCTION:
        if owner is None or isinstance(owner, types.ModuleType):
            modname = getattr(fn, "__module__", None) or getattr(owner, "__name__", "")
            if modname not in _PURE_C_MODULES:
                raise Unsupported("non-torch library call", f"{modname}.{fn.__name__}")
        else:
            _check_pure_owner(owner if not isinstance(owner, type) else None,
                              owner if isinstance(owner, type) else type(owner), fn.__name__)
            _check_method_owner(tracer, owner, fn.__name__)
    elif type(fn) is _METHOD_DESCRIPTOR or type(fn) in _WRAPPER_DESCRIPTORS:
        objclass = getattr(fn, "__objclass__", object)
        _check_pure_owner(args[0] if args else None, objclass, fn.__name__)
        if args:
            _check_method_owner(tracer, args[0], fn.__name__)
    elif hasattr(type(fn), "__call__") and isinstance(type(fn).__call__, types.FunctionType):
        # An object with a Python __call__ (a callable class instance).
        return tracer.call(frame, type(fn).__call__, [fn, *args], kwargs)
    else:
        raise Unsupported("unsupported call", f"don't know how to call {type(fn).__name__} "
                          f"{getattr(fn, '__qualname__', fn)!r}")
    if contains_tensor(args) or contains_tensor(kwargs):
        # Containers may store tensors as opaque values; anything else would compute on them.
        owner = bound_self(fn)
        if owner is None or isinstance(owner, types.ModuleType):
            owner = args[0] if args else None
        name = getattr(fn, "__name__", "")
        if name in ("get", "__getitem__", "__contains__") and isinstance(owner, (dict, set)):
            at = 0 if getattr(fn, "__self__", None) is owner else 1   # d.get(k) or dict.get(d, k)
            if len(args) > at and isinstance(args[at], TensorVar):
                args = [*args[:at], tracer.tensor_key(owner, args[at]), *args[at + 1:]]
        if not (isinstance(owner, (list, dict, set, tuple)) and name in _STORING_METHODS or
                isinstance(owner, collections.deque) and name in stdlib.DEQUE_STORING_METHODS or
                tracer.is_internal(owner) and name in ("__setattr__", "__setitem__", "__init__")):
            raise Unsupported("unsupported call", f"{getattr(fn, '__qualname__', fn)} with "
                              "tensor arguments")
    given = _identity_arguments(fn, args, kwargs)
    tracer.identity_used(*given)
    for arg in given:
        tracer.contents_read_by_c(arg)   # dict(out), OrderedDict(out): its items, read by C
    if owner is not None and not isinstance(owner, types.ModuleType):
        tracer.identity_used(owner)   # a C method of the caller's object reads it unguarded
        if getattr(fn, "__name__", "") not in _MUTATING_METHODS:
            tracer.contents_read_by_c(owner)   # (a write is _check_method_owner's)
    elif args and (type(fn) is _METHOD_DESCRIPTOR or type(fn) in _WRAPPER_DESCRIPTORS) and \
            getattr(fn, "__name__", "") not in _MUTATING_METHODS:
        tracer.contents_read_by_c(args[0])   # dict.items(out): the same read, unbound
    if _makes_text(fn, owner):   # of a size: its value, not its symbol (shapes.specialized)
        args = [shapes.specialized(a) for a in args]
        kwargs = {k: shapes.specialized(v) for k, v in kwargs.items()}
    result = fn(*args, **kwargs)
    name = getattr(fn, "__name__", "")
    if name in ("__new__", "copy", "__copy__"):
        tracer.mark_internal(result)   # list.__new__(MyList), deque.copy(): new objects
    elif name == "__iter__" and type(bound_self(fn) or (args[0] if args else None)) in \
            _PLAIN_ITERABLES:
        tracer.mark_internal(result)   # range(3).__iter__(), as iter(range(3)): a new iterator
    return result


def _makes_text(fn, owner) -> bool:
    """repr/ascii/format, and str's methods (``"{}".format(n)``, ``"%s" % (n,)``)."""
    return fn in (builtins.repr, builtins.ascii, builtins.format) or isinstance(owner, str) or \
        getattr(fn, "__objclass__", None) is str


def _identity_arguments(fn, args, kwargs) -> list:
    """The arguments whose identity C code ``fn`` may use (hash them, compare them): all of
    them, except the values a container or an object of the capture's only stores (the
    value of ``d[k] = v``, what ``append`` adds, an attribute's value)."""
    name = getattr(fn, "__name__", "")
    owner = getattr(fn, "__self__", None)
    at = 0 if owner is not None and not isinstance(owner, types.ModuleType) else 1  # d.m(k) or D.m(d, k)
    if name in ("append", "extend", "insert", "__setattr__"):
        return list(args[:at])
    if name in ("__setitem__", "setdefault"):
        return list(args[:at + 1])
    return [*args, *kwargs.values()]


def _copy(tracer, fn, args, kwargs):
    """copy.copy / copy.deepcopy: evaluated, and the copy is an object of this capture.
    A shallow copy may hold tensors (it only copies references); a deep one may not."""
    if fn is copy.deepcopy and (contains_tensor(args) or _has_tensor_attrs(args[0])):
        raise Unsupported("unsupported call", "copy.deepcopy of tensors inside a graph")
    if args:
        tracer.contents_copied_by_c(args[0])
    result = fn(*args, **kwargs)
    if not isinstance(result, (int, float, str, bool, tuple, type(None))):
        tracer.mark_internal(result)
    return result


def _has_tensor_attrs(obj) -> bool:
    d = getattr(obj, "__dict__", None)
    return bool(d) and any(isinstance(v, TensorVar) for v in d.values())


def _check_method_owner(tracer, owner, name):
    if id(owner) in tracer.external_copies and name in _MUTATING_METHODS:
        # our copy of the caller's list/dict/set changes: written back after the graph
        tracer.side_effects.mutated_copy(owner)
        return
    if not (isinstance(owner, _PLAIN_TYPES) or tracer.is_internal(owner)) or \
            tracer.is_outside_container(owner):
        if name in _MUTATING_METHODS:
            raise Unsupported("mutation of outside state", f"{type(owner).__name__}.{name}")


def _logger_call(logger: logging.Logger, fn, args):
    level = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50,
             "exception": 40}.get(fn.__name__, 30)
    if not logger.isEnabledFor(level):
        return None  # the message would not be printed: nothing to do
    raise Unsupported("print / side effect", f"logging via {logger.name}.{fn.__name__}")
