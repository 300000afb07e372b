"""Which calls capture may evaluate on constants, and which must run on every call.

Capture evaluates a call at capture time only when it is known to be pure: C functions
of the modules in ``_PURE_C_MODULES`` and C methods or constructors of the types in
``_PURE_C_TYPES`` (an allow-list). Code of ``_IMPURE_MODULES`` (random, time, os, I/O,
warnings, threads...) and objects of those modules read or change the world, so calls on
them become graph breaks and run in Python on every call. Environment reads are the one
exception: they are read once and guarded, so a changed variable recompiles.
"""
from __future__ import annotations

import builtins
import collections
import functools
import inspect
import os
import re
import sys
import types

import torch

from .breaks import Unsupported


# Modules whose C functions are pure enough to evaluate on constants during capture.
_PURE_C_MODULES = {"builtins", "math", "_operator", "operator", "itertools", "_functools",
                   "functools", "_collections", "collections", "_abc", "posixpath", "_string",
                   "re", "_sre", "typing", "_typing", "enum", "copy", "keyword", "types"}


# Plain values and containers: their mutating methods are allowed on our own copies.
_PLAIN_TYPES = (list, dict, tuple, str, set, frozenset, int, float, bool, bytes, range,
                slice, torch.Size, type(None), types.MappingProxyType, complex)


# Types whose C methods (and constructors) are pure functions of the object and arguments.
_PURE_C_TYPES = _PLAIN_TYPES + (
                 collections.OrderedDict, collections.defaultdict, collections.deque,
                 functools.partial, types.SimpleNamespace, BaseException, re.Pattern, re.Match,
                 torch.device, torch.dtype, torch.finfo, torch.iinfo, type({}.items()),
                 type({}.keys()), type({}.values()), type(Ellipsis), type(NotImplemented))


# Modules whose code reads or changes state outside the program: their functions, classes
# and the methods of their objects (os.environ, random.Random, io.StringIO) run in Python
# on every call, never once at capture.
_IMPURE_MODULES = {"random", "_random", "os", "posix", "nt", "time", "datetime", "_datetime",
                   "uuid", "secrets", "io", "_io", "warnings", "_warnings", "sys", "threading",
                   "_thread", "subprocess", "socket", "tempfile", "shutil", "glob", "pathlib",
                   "pickle", "gc", "signal", "select", "faulthandler", "queue", "asyncio"}


_IMPURE_BUILTINS = {builtins.print, builtins.input, builtins.open, builtins.exec, builtins.eval,
                    builtins.compile, builtins.breakpoint, builtins.setattr, builtins.delattr,
                    builtins.globals, builtins.__import__}


_BUILTIN_FUNCTION = type(len)


def _impure_reason(fn) -> str | None:
    """Why calling ``fn`` must happen in Python on every call, or None: its code, its class
    or the object it is bound to comes from a module of ``_IMPURE_MODULES``."""
    if isinstance(fn, type):
        module, what = fn.__module__, fn.__qualname__
    elif isinstance(fn, types.MethodType) or type(fn) is _BUILTIN_FUNCTION and \
            not isinstance(fn.__self__, (types.ModuleType, type(None), type)):
        owner = fn.__self__
        module = type(owner).__module__
        what = f"{type(owner).__qualname__}.{getattr(fn, '__name__', '?')}"
    else:
        module = getattr(fn, "__module__", None)
        if module is None and type(fn) is _BUILTIN_FUNCTION:
            module = getattr(fn.__self__, "__name__", None)
        what = f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"
    if module in _IMPURE_MODULES:
        return f"{what}() reads or changes state outside the program"
    return None


def _reads_environ(fn, args) -> bool:
    """``os.environ.get(k)``, ``os.environ[k]``, ``k in os.environ``, ``os.getenv(k)``."""
    if fn is os.getenv:
        return True
    if isinstance(fn, types.MethodType):
        fn, args = fn.__func__, [fn.__self__]
    return isinstance(fn, types.FunctionType) and fn.__name__ in ("get", "__getitem__",
                                                                  "__contains__") \
        and bool(args) and args[0] is os.environ


def _read_environ(tracer, fn, args, kwargs):
    """An environment variable is read now and guarded: the guard reads it again on every
    call, so a changed environment recompiles instead of seeing the old value."""
    if isinstance(fn, types.MethodType):
        fn, args = fn.__func__, [fn.__self__, *args]
    if fn is os.getenv:
        args = [os.environ, *args]
    name = "get" if fn is os.getenv else fn.__name__
    params = inspect.signature(getattr(os.environ, name)).bind(*args[1:], **kwargs).arguments
    key = params["key"]
    if not isinstance(key, str):
        raise Unsupported("impure call", f"os.environ.{name} with a {type(key).__name__} key")
    value = os.environ.get(key)
    tracer.guards.constant(f"{tracer.expr_of(os.environ)}.get({key!r})", value)
    if name == "__contains__":
        return value is not None
    if value is None and name == "__getitem__":
        from .breaks import UserError
        raise UserError(KeyError(key))
    return value if value is not None else params.get("default")


def _guarded_reader(fn):
    """A model of ``fn()``, a reader of one interpreter setting: the value now, guarded by
    calling ``fn`` again (cheap, no effects), so a changed setting recompiles."""
    def read(tracer, frame, args, kwargs):
        if args or kwargs:
            raise Unsupported("impure call", f"{fn.__module__}.{fn.__name__}() with arguments")
        value = fn()
        tracer.guards.constant(f"{tracer.guards.const(fn, 'F')}()", value)
        return value
    return read


GUARDED_READERS = {fn: _guarded_reader(fn) for fn in (
    sys.getrecursionlimit, sys.getdefaultencoding, sys.getfilesystemencoding,
    sys.getswitchinterval,
    # the caller's torch dispatch modes (capture's own fake mode is not one of them:
    # run as a torch operation, it would count that mode)
    torch._C._len_torch_dispatch_stack)}


def _is_impure_object(value) -> bool:
    """An object whose content is the world's state (os.environ, a file, a Random)."""
    return type(value).__module__ in _IMPURE_MODULES


def _check_pure_arguments(args, kwargs, what: str):
    for v in (*args, *kwargs.values()):
        if _is_impure_object(v):
            raise Unsupported("impure call", f"{what} of {type(v).__qualname__}, whose content "
                              "is state outside the program")


# object's own methods that are pure on any object (``__setattr__``/``__delattr__`` only on
# objects of this capture: _check_method_owner refuses them on outside ones).
_PURE_OBJECT_METHODS = {"__new__", "__init__", "__eq__", "__ne__", "__hash__", "__repr__",
                        "__str__", "__format__", "__getattribute__", "__dir__", "__sizeof__",
                        "__init_subclass__", "__subclasshook__", "__reduce_ex__", "__lt__",
                        "__le__", "__gt__", "__ge__", "__setattr__", "__delattr__"}


# C methods of other types that only answer a question about global state or the object.
_PURE_C_METHODS = {"_EngineBase.is_checkpoint_valid"}


# C classes outside _PURE_C_MODULES whose construction is a pure function of the arguments.
_PURE_C_CLASSES = {"numpy.dtype"}


def _check_pure_owner(obj, cls: type, name: str):
    """A C method of ``cls`` (bound to ``obj`` if given) may be evaluated at capture only
    if ``cls`` is a type known to be pure (the allow-list ``_PURE_C_TYPES``)."""
    if issubclass(cls, _PURE_C_TYPES) or isinstance(obj, _PURE_C_TYPES) or \
            f"{cls.__qualname__}.{name}" in _PURE_C_METHODS:
        return
    if cls is object and name in _PURE_OBJECT_METHODS:
        return
    kind = "impure call" if cls.__module__ in _IMPURE_MODULES else "non-torch library call"
    raise Unsupported(kind, f"{cls.__qualname__}.{name} is C code that is not known to be pure")
