"""What calling a value does during capture.

Four outcomes, decided by what the callable is:
- a torch operation (C builtins of torch, ``torch.nn.functional``, ``torch.functional``,
  tensor methods): recorded as an FX node, run on fake tensors;
- Python code (functions, methods, modules' ``forward``, classes' ``__init__``): inlined,
  so its own torch operations and guards join the graph;
- a pure function of constants (``len``, ``math.sqrt``, ``str.format``, ...): evaluated now,
  its result a constant of the graph;
- anything else (print, numpy, unknown C code, outside mutation): ``Unsupported``.
"""
from __future__ import annotations

import builtins
import copy
import functools
import logging
import math
import types

import torch

from . import context
from .breaks import Unsupported
from .values import TensorVar, TensorMethod, SuperProxy, contains_tensor

# Code objects of functions marked @tempa.disable (filled by the api layer).
DISABLED_CODES: set = set()

_CO_GENERATOR, _CO_COROUTINE, _CO_ASYNC_GEN = 0x20, 0x80, 0x200
_INLINE_DEPTH_LIMIT = 48

# Tensor methods answered from metadata (no graph node): the result is a Python value.
_TENSOR_METADATA_METHODS = {
    "size", "dim", "ndimension", "stride", "numel", "nelement", "is_contiguous", "element_size",
    "is_floating_point", "is_complex", "get_device", "is_signed", "storage_offset",
    "is_inference", "__len__", "has_names", "is_set_to",
}
_TENSOR_DATA_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__",
                        "__index__", "data_ptr", "__array__", "__iter__", "__format__", "__repr__"}

# torch callables with global side effects: never recorded, never run during capture.
_TORCH_SIDE_EFFECTS = {"manual_seed", "seed", "set_default_dtype", "set_default_device",
                       "set_printoptions", "use_deterministic_algorithms", "save", "load",
                       "set_num_threads", "synchronize", "_set_grad_enabled", "set_rng_state",
                       "autocast_increment_nesting", "autocast_decrement_nesting",
                       "clear_autocast_cache"}

# torch C functions that only look at Python types or global state (guarded): evaluated.
_PURE_TORCH_QUERIES = {torch._C._has_torch_function, torch._C._has_torch_function_unary,
                       torch._C._has_torch_function_variadic, torch.is_autocast_enabled,
                       torch.get_autocast_dtype, torch.get_default_dtype,
                       torch.is_autocast_cache_enabled, torch._C._get_cudnn_enabled,
                       torch.are_deterministic_algorithms_enabled}

# Modules whose C functions are pure enough to evaluate on constants during capture.
_PURE_C_MODULES = {"builtins", "math", "_operator", "operator", "itertools", "_functools",
                   "functools", "_collections", "collections", "_abc", "posixpath", "_string",
                   "re", "_sre", "typing", "_typing", "enum", "copy", "keyword", "_warnings"}
_PURE_C_TYPES = (list, dict, tuple, str, set, frozenset, int, float, bool, bytes, range,
                 slice, torch.Size, type(None), types.MappingProxyType, complex)
_MUTATING_METHODS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                     "update", "setdefault", "popitem", "__setitem__", "__delitem__", "add",
                     "discard", "__iadd__"}
# Standard-library Python code that only reflects on objects: evaluated, not interpreted
# (BERT calls inspect.signature on every forward; interpreting it costs ~30 functions).
_EVALUATED_PY_MODULES = {"inspect", "typing", "dataclasses", "enum", "re", "posixpath",
                         "genericpath", "abc", "_collections_abc", "collections.abc", "keyword",
                         "string", "textwrap"}
_REFLECTIVE = {"fields", "is_dataclass", "signature", "isclass", "isfunction", "ismethod",
               "getmro", "unwrap"}
_STORING_METHODS = {"append", "extend", "insert", "__setitem__", "update", "setdefault", "get",
                    "pop", "__getitem__", "copy", "keys", "values", "items", "__init__",
                    "__len__", "index", "count", "add", "fromkeys", "__contains__", "remove"}
_IMPURE_BUILTINS = {builtins.print, builtins.input, builtins.open, builtins.exec, builtins.eval,
                    builtins.compile, builtins.breakpoint, builtins.setattr, builtins.delattr,
                    builtins.globals, builtins.locals, builtins.vars, builtins.__import__}
_BUILTIN_FUNCTION = type(len)
_METHOD_DESCRIPTOR = type(str.join)
_WRAPPER_DESCRIPTORS = (type(object.__init__), type(object().__str__), type(dict.__dict__["fromkeys"]))


def call(tracer, frame, fn, args: list, kwargs: dict):
    if type(fn) is TensorMethod:
        return tensor_method(tracer, fn, args, kwargs)
    special = _SPECIAL.get(_key(fn))
    if special is not None:
        return special(tracer, frame, args, kwargs)
    if isinstance(fn, torch.nn.Module):
        return call_module(tracer, frame, fn, args, kwargs)
    if isinstance(fn, types.MethodType):
        return call(tracer, frame, fn.__func__, [fn.__self__, *args], kwargs)
    if isinstance(fn, types.FunctionType):
        if is_torch_op(fn):
            return tracer.builder.call("call_function", fn, tuple(args), kwargs)
        if fn is copy.copy or fn is copy.deepcopy:
            return _copy(tracer, fn, args, kwargs)
        if fn.__module__ in _EVALUATED_PY_MODULES and not fn.__code__.co_flags & _CO_GENERATOR \
                and (fn.__module__ in ("inspect", "dataclasses") and fn.__name__ in _REFLECTIVE
                     or not (contains_tensor(args) or contains_tensor(kwargs))):
            return fn(*args, **kwargs)
        return inline(tracer, frame, fn, args, kwargs)
    if isinstance(fn, functools.partial):
        return call(tracer, frame, fn.func, [*fn.args, *args], {**fn.keywords, **kwargs})
    if isinstance(fn, type):
        return call_class(tracer, frame, fn, args, kwargs)
    if is_torch_op(fn):
        name = getattr(fn, "__name__", "")
        if name in _TORCH_SIDE_EFFECTS or name.startswith("set_"):
            raise Unsupported("unsupported call", f"torch.{name} changes global state")
        if fn in _PURE_TORCH_QUERIES:
            return fn(*args, **kwargs)   # type/state queries: no graph node needed
        return tracer.builder.call("call_function", fn, tuple(args), kwargs)
    return call_c(tracer, frame, fn, args, kwargs)


def _key(fn):
    try:
        hash(fn)
        return fn
    except TypeError:
        return None


def is_torch_op(fn) -> bool:
    """Is ``fn`` an operation to record in the graph (rather than code to inline)?"""
    t = type(fn)
    if t is _BUILTIN_FUNCTION:
        mod = getattr(fn, "__module__", None) or ""
        if mod.startswith("torch"):
            return True
        owner = getattr(fn, "__self__", None)
        return isinstance(owner, types.ModuleType) and owner.__name__.startswith("torch._C")
    if t is _METHOD_DESCRIPTOR or t in _WRAPPER_DESCRIPTORS:
        owner = getattr(fn, "__objclass__", None)
        return owner is not None and issubclass(owner, torch._C.TensorBase)
    if t is types.FunctionType:
        mod = fn.__module__ or ""
        if fn.__name__.startswith("_"):
            return False   # F._canonical_mask, F._none_or_dtype: helpers to inline, not ops
        return mod in ("torch.nn.functional", "torch.functional") or \
            (mod == "torch._tensor" and fn.__name__ in _PY_TENSOR_METHOD_OPS)
    return False


# Python-level methods of torch.Tensor that are tensor operations in their own right.
_PY_TENSOR_METHOD_OPS = {"split", "unique", "norm", "stft", "istft", "lu", "unflatten",
                         "__rsub__", "__rdiv__", "__rtruediv__", "__rpow__", "__rmatmul__",
                         "__floordiv__", "__rfloordiv__", "__format__", "__ipow__",
                         "__pow__", "__neg__", "__abs__", "__len__", "__contains__", "__reversed__"}


def tensor_method(tracer, m: TensorMethod, args, kwargs):
    name, t = m.name, m.tensor
    if name in _TENSOR_METADATA_METHODS:
        if contains_tensor(args) or contains_tensor(kwargs):
            raise Unsupported("unsupported call", f"tensor.{name} with tensor arguments")
        return getattr(t.fake, name)(*args, **kwargs)
    if name in _TENSOR_DATA_METHODS:
        raise Unsupported("data-dependent value", f"tensor.{name}() needs the tensor's value")
    if name in ("backward", "register_hook", "retain_grad", "record_stream", "share_memory_"):
        raise Unsupported("unsupported call", f"tensor.{name}() inside a captured graph")
    if name == "type" and not args and not kwargs:
        return t.fake.type().replace("torch.", "torch.")  # a string like 'torch.FloatTensor'
    if name in ("cpu", "cuda", "to") and not _changes_anything(t, name, args, kwargs):
        return t
    return tracer.builder.call("call_method", name, (t, *args), kwargs)


def _changes_anything(t: TensorVar, name, args, kwargs) -> bool:
    if name == "cpu":
        return t.fake.device.type != "cpu"
    return True


def call_module(tracer, frame, mod: torch.nn.Module, args, kwargs):
    if mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or \
            mod._backward_pre_hooks or _global_hooks():
        raise Unsupported("hooks", f"{type(mod).__name__} has forward/backward hooks")
    forward = mod.__dict__.get("forward")
    if forward is None:
        forward = types.MethodType(type(mod).forward, mod)
    return call(tracer, frame, forward, list(args), kwargs)


def _global_hooks() -> bool:
    from torch.nn.modules import module as m
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks or
                m._global_backward_hooks or m._global_backward_pre_hooks)


def inline(tracer, frame, fn: types.FunctionType, args, kwargs):
    code = fn.__code__
    if code in DISABLED_CODES:
        raise Unsupported("disabled by tempa.disable", f"{fn.__qualname__} is marked @tempa.disable")
    if code.co_flags & (_CO_COROUTINE | _CO_ASYNC_GEN):
        raise Unsupported("unsupported construct", f"{fn.__qualname__} is a coroutine")
    if tracer.depth >= _INLINE_DEPTH_LIMIT:
        raise Unsupported("unsupported construct", "calls nested too deeply (recursion?)")
    from .interpreter import Frame  # the two modules call each other
    bound = bind_arguments(fn, args, kwargs)
    child = Frame(tracer, code, fn.__globals__, bound, fn.__closure__, name=fn.__qualname__,
                  parent=frame, is_generator=bool(code.co_flags & _CO_GENERATOR))
    tracer.depth += 1
    try:
        result = child.run()
    finally:
        tracer.depth -= 1
    if child.is_generator:
        from .values import CapturedIter
        return CapturedIter(child.yielded)
    return result


def bind_arguments(fn, args, kwargs) -> dict:
    """Bind a call's arguments to ``fn``'s parameter names as CPython does (the names the
    code uses: a comprehension's implicit ``.0`` included, which inspect renames)."""
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
            out[name] = defaults[j - first_default]
    for name in kw_names:
        if name not in out:
            if name not in kwdefaults:
                raise error(f"missing required keyword-only argument: '{name}'")
            out[name] = kwdefaults[name]
    if has_varkw:
        out[names[i]] = extra
    return out


def call_class(tracer, frame, cls: type, args, kwargs):
    if cls in _BUILTIN_TYPES:
        return _builtin_type(tracer, frame, cls, args, kwargs)
    if cls in context.GRAD_CONTEXT_CLASSES or context.is_autocast_class(cls):
        return context.make(tracer, cls, args, kwargs)
    if issubclass(cls, torch.Tensor):
        raise Unsupported("unsupported call", f"constructing {cls.__name__} inside a graph")
    if issubclass(cls, torch.nn.Module):
        raise Unsupported("unsupported construct", f"creating a {cls.__name__} module in forward")
    mod = cls.__module__ or ""
    if mod.startswith("torch") and not hasattr(cls, "__dataclass_fields__"):
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
        # its arguments, tensors included.
        if (contains_tensor(args) or contains_tensor(kwargs)) and not issubclass(
                cls, (functools.partial, dict, list, tuple, set)):
            raise Unsupported("unsupported call", f"{cls.__qualname__}(tensor)")
        return tracer.mark_internal(cls(*args, **kwargs))
    if isinstance(new, types.FunctionType) or isinstance(new, staticmethod):
        obj = call(tracer, frame, new, [cls, *args], kwargs)
    else:
        obj = new(cls) if new is not object.__new__ else object.__new__(cls)
    tracer.mark_internal(obj)
    init = cls.__init__
    if isinstance(init, types.FunctionType):
        inline(tracer, frame, init, [obj, *args], kwargs)
    elif init is not object.__init__:
        if contains_tensor(args) or contains_tensor(kwargs):
            # e.g. an OrderedDict subclass filled from tensors: the C init just stores them.
            init(obj, *args, **kwargs)
        else:
            init(obj, *args, **kwargs)
    return obj


def call_c(tracer, frame, fn, args, kwargs):
    """A callable that is neither Python code nor a torch op."""
    if fn in _IMPURE_BUILTINS if _key(fn) is not None else False:
        kind = "print / side effect" if fn is builtins.print else "unsupported call"
        raise Unsupported(kind, f"{getattr(fn, '__name__', fn)}() has effects outside the graph")
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, logging.Logger):
        return _logger_call(owner, fn, args)
    if isinstance(fn, functools._lru_cache_wrapper):
        if contains_tensor(args) or contains_tensor(kwargs):
            return call(tracer, frame, fn.__wrapped__, args, kwargs)
        return fn(*args, **kwargs)
    if type(fn) is _BUILTIN_FUNCTION:
        if owner is None or isinstance(owner, types.ModuleType):
            modname = getattr(fn, "__module__", None) or getattr(owner, "__name__", "")
            if modname not in _PURE_C_MODULES:
                raise Unsupported("non-torch library call", f"{modname}.{fn.__name__}")
        else:
            _check_method_owner(tracer, owner, fn.__name__)
    elif type(fn) is _METHOD_DESCRIPTOR or type(fn) in _WRAPPER_DESCRIPTORS:
        objclass = getattr(fn, "__objclass__", object)
        if not issubclass(objclass, _PURE_C_TYPES + (object,)):
            raise Unsupported("non-torch library call", f"{objclass.__name__}.{fn.__name__}")
        if args:
            _check_method_owner(tracer, args[0], fn.__name__)
    elif hasattr(type(fn), "__call__") and isinstance(type(fn).__call__, types.FunctionType):
        # An object with a Python __call__ (a callable class instance).
        return call(tracer, frame, type(fn).__call__, [fn, *args], kwargs)
    else:
        raise Unsupported("unsupported call", f"don't know how to call {type(fn).__name__} "
                          f"{getattr(fn, '__qualname__', fn)!r}")
    if contains_tensor(args) or contains_tensor(kwargs):
        # Containers may store tensors as opaque values; anything else would compute on them.
        owner = getattr(fn, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            owner = args[0] if args else None
        name = getattr(fn, "__name__", "")
        if not (isinstance(owner, (list, dict, set, tuple)) and name in _STORING_METHODS or
                tracer.is_internal(owner) and name in ("__setattr__", "__setitem__", "__init__")):
            raise Unsupported("unsupported call", f"{getattr(fn, '__qualname__', fn)} with "
                              "tensor arguments")
    return fn(*args, **kwargs)


def _copy(tracer, fn, args, kwargs):
    """copy.copy / copy.deepcopy: evaluated, and the copy is an object of this capture.
    A shallow copy may hold tensors (it only copies references); a deep one may not."""
    if fn is copy.deepcopy and (contains_tensor(args) or _has_tensor_attrs(args[0])):
        raise Unsupported("unsupported call", "copy.deepcopy of tensors inside a graph")
    result = fn(*args, **kwargs)
    if not isinstance(result, (int, float, str, bool, tuple, type(None))):
        tracer.mark_internal(result)
    return result


def _has_tensor_attrs(obj) -> bool:
    d = getattr(obj, "__dict__", None)
    return bool(d) and any(isinstance(v, TensorVar) for v in d.values())


def _check_method_owner(tracer, owner, name):
    if id(owner) in tracer.external_copies and name in _MUTATING_METHODS:
        raise Unsupported("mutation of outside state", f"{type(owner).__name__}.{name} on an "
                          "object passed in by the caller")
    if not (isinstance(owner, _PURE_C_TYPES) or tracer.is_internal(owner)):
        if name in _MUTATING_METHODS:
            raise Unsupported("mutation of outside state", f"{type(owner).__name__}.{name}")


def _logger_call(logger: logging.Logger, fn, args):
    level = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "critical": 50,
             "exception": 40}.get(fn.__name__, 30)
    if not logger.isEnabledFor(level):
        return None  # the message would not be printed: nothing to do
    raise Unsupported("print / side effect", f"logging via {logger.name}.{fn.__name__}")


# -- builtins ---------------------------------------------------------------------------

def _tensor_type(tracer, t: TensorVar):
    return torch.nn.Parameter if t.node.op == "placeholder" and _is_param(tracer, t) else torch.Tensor


def _is_param(tracer, t):
    return any(node is t.node and isinstance(obj, torch.nn.Parameter)
               for node, obj in tracer.builder.attr_inputs)


def _isinstance(tracer, frame, args, kwargs):
    value, cls = args
    if isinstance(value, TensorVar):
        return issubclass(_tensor_type(tracer, value), cls)
    return isinstance(value, cls)


def _type(tracer, frame, args, kwargs):
    if len(args) == 1 and isinstance(args[0], TensorVar):
        return _tensor_type(tracer, args[0])
    if len(args) == 1:
        return type(args[0])
    raise Unsupported("unsupported construct", "type() with three arguments")


def _len(tracer, frame, args, kwargs):
    (v,) = args
    if isinstance(v, TensorVar):
        if v.fake.dim() == 0:
            from .breaks import UserError
            raise UserError(TypeError("len() of a 0-d tensor"))
        return v.fake.shape[0]
    if isinstance(v, torch.nn.Module):
        return len(v)
    return len(v)


def _getattr(tracer, frame, args, kwargs):
    obj, name = args[0], args[1]
    try:
        return tracer.load_attr(obj, name, frame)
    except AttributeError:
        if len(args) == 3:
            return args[2]
        raise


def _hasattr(tracer, frame, args, kwargs):
    obj, name = args
    try:
        tracer.load_attr(obj, name, frame)
        return True
    except AttributeError:
        return False


def _setattr(tracer, frame, args, kwargs):
    obj, name, value = args
    frame.store_attr(obj, name, value)
    return None


def _delattr(tracer, frame, args, kwargs):
    obj, name = args
    if not tracer.is_internal(obj):
        raise Unsupported("mutation of outside state", f"delattr({type(obj).__name__}, {name!r})")
    delattr(obj, name)
    return None


def _iter(tracer, frame, args, kwargs):
    return frame.get_iter(args[0])


def _next(tracer, frame, args, kwargs):
    return next(*args)


def _super(tracer, frame, args, kwargs):
    if args:
        return SuperProxy(args[0], args[1])
    return frame.zero_arg_super()


def _unbind_if_tensor(tracer, v):
    if isinstance(v, TensorVar):
        return list(tracer.builder.call("call_method", "unbind", (v, 0), {}))
    return v


def _list(tracer, frame, args, kwargs):
    return list(frame.get_iter(args[0])) if args else []


def _tuple(tracer, frame, args, kwargs):
    return tuple(frame.get_iter(args[0])) if args else ()


def _sum(tracer, frame, args, kwargs):
    items = list(frame.get_iter(args[0]))
    total = args[1] if len(args) > 1 else kwargs.get("start", 0)
    for item in items:
        total = frame.binary_op("NB_ADD", total, item)
    return total


def _minmax(which):
    def handler(tracer, frame, args, kwargs):
        items = list(frame.get_iter(args[0])) if len(args) == 1 else list(args)
        if any(isinstance(v, TensorVar) for v in items):
            raise Unsupported("data-dependent branch", f"{which}() over tensors compares values")
        if "key" in kwargs and isinstance(kwargs["key"], types.FunctionType):
            keys = [frame.call(kwargs["key"], [v], {}) for v in items]
            pairs = list(zip(keys, range(len(items))))
            best = (min if which == "min" else max)(pairs)
            return items[best[1]]
        return (min if which == "min" else max)(items, **kwargs)
    return handler


def _abs(tracer, frame, args, kwargs):
    if isinstance(args[0], TensorVar):
        return tracer.builder.call("call_function", torch.abs, (args[0],), {})
    return abs(args[0])


def _to_python_number(kind):
    def handler(tracer, frame, args, kwargs):
        if args and isinstance(args[0], TensorVar):
            raise Unsupported("data-dependent value", f"{kind.__name__}(tensor) needs its value")
        return kind(*args, **kwargs)
    return handler


def _map(tracer, frame, args, kwargs):
    fn, *iterables = args
    return ([frame.call(fn, list(items), {}) for items in zip(*[frame.get_iter(i) for i in iterables])])


def _filter(tracer, frame, args, kwargs):
    fn, iterable = args
    items = list(frame.get_iter(iterable))
    if fn is None:
        return iter([v for v in items if frame.truth(v)])
    return iter([v for v in items if frame.truth(frame.call(fn, [v], {}))])


def _sorted(tracer, frame, args, kwargs):
    items = list(frame.get_iter(args[0]))
    key = kwargs.get("key")
    if isinstance(key, types.FunctionType):
        keys = [frame.call(key, [v], {}) for v in items]
        order = sorted(range(len(items)), key=lambda i: keys[i], reverse=kwargs.get("reverse", False))
        return [items[i] for i in order]
    return sorted(items, **kwargs)


def _enumerate(tracer, frame, args, kwargs):
    return enumerate(frame.get_iter(args[0]), *args[1:], **kwargs)


def _zip(tracer, frame, args, kwargs):
    return zip(*[frame.get_iter(a) for a in args], **kwargs)


def _reversed(tracer, frame, args, kwargs):
    v = args[0]
    if isinstance(v, TensorVar):
        raise Unsupported("unsupported call", "reversed(tensor)")
    if isinstance(v, torch.nn.Module):
        return iter(list(frame.get_iter(v))[::-1])
    return reversed(v)


def _any_all(which):
    def handler(tracer, frame, args, kwargs):
        items = frame.get_iter(args[0])
        for v in items:
            t = frame.truth(v)
            if which is any and t:
                return True
            if which is all and not t:
                return False
        return which is all
    return handler


def _callable(tracer, frame, args, kwargs):
    v = args[0]
    return isinstance(v, (TensorMethod,)) or (not isinstance(v, TensorVar) and callable(v))


def _id(tracer, frame, args, kwargs):
    if isinstance(args[0], TensorVar):
        raise Unsupported("unsupported call", "id() of a tensor")
    return id(args[0])


def _is_compiling(tracer, frame, args, kwargs):
    return True


def _false(tracer, frame, args, kwargs):
    return False


def _grad_enabled(tracer, frame, args, kwargs):
    return torch.is_grad_enabled()


def _set_grad_enabled_fn(tracer, frame, args, kwargs):
    return context.make(tracer, torch.set_grad_enabled, args, kwargs)


def _builtin_type(tracer, frame, cls, args, kwargs):
    if cls in (list, tuple, set, frozenset) and args:
        items = list(frame.get_iter(args[0]))
        return cls(items)
    if cls is dict:
        if args and isinstance(args[0], TensorVar):
            raise Unsupported("unsupported call", "dict(tensor)")
        return dict(*args, **kwargs)
    if cls in (int, float, bool, complex) and args and isinstance(args[0], TensorVar):
        raise Unsupported("data-dependent value", f"{cls.__name__}(tensor) needs its value")
    if cls is bool and args:
        return frame.truth(args[0])
    if cls is str and args and isinstance(args[0], TensorVar):
        raise Unsupported("data-dependent value", "str(tensor) needs its value")
    handler = _ITERATING_TYPES.get(cls)
    if handler is not None:
        return handler(tracer, frame, args, kwargs)
    if contains_tensor(args) or contains_tensor(kwargs):
        if cls is slice:
            return slice(*args)
        raise Unsupported("unsupported call", f"{cls.__name__}(tensor)")
    return cls(*args, **kwargs)


# Builtin types whose construction walks an iterable or needs the frame.
_ITERATING_TYPES = {type: _type, super: _super, enumerate: _enumerate, zip: _zip, map: _map,
                    filter: _filter, reversed: _reversed}
_BUILTIN_TYPES = {list, tuple, dict, set, frozenset, int, float, bool, str, complex, type,
                  super, enumerate, zip, map, filter, reversed, slice, range, object, bytes}

_SPECIAL = {
    builtins.isinstance: _isinstance,
    builtins.len: _len,
    builtins.getattr: _getattr,
    builtins.hasattr: _hasattr,
    builtins.setattr: _setattr,
    builtins.delattr: _delattr,
    builtins.iter: _iter,
    builtins.next: _next,
    builtins.sum: _sum,
    builtins.min: _minmax("min"),
    builtins.max: _minmax("max"),
    builtins.abs: _abs,
    builtins.any: _any_all(any),
    builtins.all: _any_all(all),
    builtins.sorted: _sorted,
    builtins.callable: _callable,
    builtins.id: _id,
    builtins.round: _to_python_number(round),
    math.sqrt: _to_python_number(math.sqrt),
    torch.compiler.is_compiling: _is_compiling,
    torch.compiler.is_dynamo_compiling: _is_compiling,
    torch.jit.is_scripting: _false,
    torch.jit.is_tracing: _false,
    torch._C._get_tracing_state: lambda *a: None,
    torch.is_grad_enabled: _grad_enabled,
    torch._C.is_grad_enabled: _grad_enabled,
}
for _name in ("is_exporting",):
    if hasattr(torch.compiler, _name):
        _SPECIAL[getattr(torch.compiler, _name)] = _false
