"""What calling a value does during capture: the dispatcher.

Four outcomes, decided by what the callable is:
- a torch operation (C builtins of torch, ``torch.nn.functional``, ``torch.functional``,
  tensor methods): recorded as an FX node, run on fake tensors;
- Python code (functions, methods, modules' ``forward``, classes' ``__init__``): inlined,
  so its own torch operations and guards join the graph;
- a pure function of constants (``len``, ``math.sqrt``, ``str.format``, ...): evaluated now,
  its result a constant of the graph;
- anything else (print, numpy, unknown C code, outside mutation): ``Unsupported``.

Evaluating at capture bakes the result into every later call, so it is only done for code
known to be pure: C functions of the modules in ``_PURE_C_MODULES`` and methods of the types
in ``_PURE_C_TYPES`` (an allow-list). Code that reads or changes the world (``random``,
``time``, ``os.environ``, ``warnings``, I/O, an iterator from outside the call) is
``impure``: a graph break, so Python runs it on every call. Unknown C code breaks too.
The rules live in ``purity.py``; the guards a module call implies in ``module_guards.py``.

This file holds ``call`` and what it decides itself: torch ops (``is_torch_op``), tensor
methods, a tensor's storage, ``out=``, module calls, and the table of modelled callables
(``_SPECIAL``). The outcomes it hands on live next to it, each imported one way from here:
``calls_inline.py`` (Python code: inlining, argument binding, generators, tempa's own
code), ``calls_classes.py`` (calling a class), ``calls_library.py`` (C and library code
that is neither a torch op nor Python) and ``calls_builtins.py`` (models of the builtins).
Those call back into ``call`` through ``tracer.call``.
"""
from __future__ import annotations

import copy
import functools
import inspect
import types

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from . import autograd_function, calls_builtins, cond, custom_ops, func_transforms, higher_order, \
    numpy_values, scalar_tensors, scalars, stdlib
from .breaks import Unsupported, UserError
from .calls_builtins import _tensor_type
from .calls_classes import call_class
from .calls_inline import _CO_GENERATOR, inline
from .calls_library import _METHOD_DESCRIPTOR, _WRAPPER_DESCRIPTORS, _copy, _key, call_c
from .module_guards import _MODULE_CALL, _guard_module_class, guard_module_call
from .purity import _BUILTIN_FUNCTION, GUARDED_READERS, _impure_reason, _read_environ, \
    _reads_environ
from .values import NdarrayMethod, TensorVar, StorageMethod, StorageVar, TensorMethod, \
    contains_tensor

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

# Standard-library Python code that only reflects on objects: evaluated, not interpreted
# (BERT calls inspect.signature on every forward; interpreting it costs ~30 functions).
_EVALUATED_PY_MODULES = {"inspect", "typing", "dataclasses", "enum", "re", "posixpath",
                         "genericpath", "abc", "_collections_abc", "collections.abc", "keyword",
                         "string", "textwrap"}
_REFLECTIVE = {"fields", "is_dataclass", "signature", "isclass", "isfunction", "ismethod",
               "getmro", "unwrap"}


# object's slots modelled in calls_builtins.MODELS, also when reached bound to an object
_OBJECT_SLOTS = ("__setattr__", "__getattribute__")


def call(tracer, frame, fn, args: list, kwargs: dict):
    if type(fn) is TensorMethod:
        return tensor_method(tracer, fn, args, kwargs)
    if type(fn) is NdarrayMethod:
        return numpy_values.call_method(tracer, fn, args, kwargs)
    if type(fn) is StorageMethod:
        if args or kwargs:
            raise Unsupported("unsupported call", f"storage.{fn.name}() with arguments")
        return fn.storage.nbytes
    if any(type(v) is StorageVar for v in (*args, *kwargs.values())):
        # capture knows a storage's size only; whatever else reads it needs the real one
        raise Unsupported("data-dependent value", f"{getattr(fn, '__qualname__', fn)}() given "
                          "a tensor's storage needs the real storage")
    if type(fn) is higher_order.VmappedOp:
        return tracer.builder.call("call_function", fn.vmapped, tuple(args), kwargs)
    if type(fn) is func_transforms.TransformedFunction:
        return func_transforms.call(tracer, frame, fn, args, kwargs)
    if type(fn) is func_transforms.VjpFunction:
        return func_transforms.call_vjp(tracer, frame, fn, args, kwargs)
    if numpy_values.is_numpy_callable(fn):
        return numpy_values.call_numpy(tracer, fn, args, kwargs)
    if numpy_values.holds_array((args, kwargs)):
        if fn in numpy_values._FROM_NUMPY and numpy_values.is_array(args[0] if args else None):
            return numpy_values.from_numpy(tracer, fn, args, kwargs)
        if is_torch_op(fn):
            raise Unsupported("non-torch library call", f"{getattr(fn, '__name__', fn)}() given "
                              "a numpy array runs in Python")
    if type(fn) is types.MethodWrapperType and fn.__name__ in _OBJECT_SLOTS and \
            fn.__objclass__ is object:   # super().__setattr__(k, v): object's, bound
        fn, args = getattr(object, fn.__name__), [fn.__self__, *args]
    special = _SPECIAL.get(_key(fn))
    if special is not None:
        return special(tracer, frame, args, kwargs)
    if type(fn) is types.MethodWrapperType and fn.__name__ == "__get__" and \
            type(fn.__self__) in (types.GetSetDescriptorType, types.MemberDescriptorType):
        return _descriptor_get(tracer, frame, fn.__self__, args, kwargs)
    if _reads_environ(fn, args):
        return _read_environ(tracer, fn, args, kwargs)
    impure = _impure_reason(fn)
    if impure:
        raise Unsupported("impure call", impure)
    if isinstance(fn, torch.nn.Module):
        return call_module(tracer, frame, fn, args, kwargs)
    if higher_order.is_autograd_function_apply(fn):
        return autograd_function.apply(tracer, frame, fn.__self__, args, kwargs)
    if isinstance(fn, types.MethodType):
        return call(tracer, frame, fn.__func__, [fn.__self__, *args], kwargs)
    if kwargs.get("out") is not None and is_torch_op(fn):
        return _call_with_out(tracer, fn, args, kwargs)
    if isinstance(fn, types.FunctionType):
        if is_torch_op(fn):
            return tracer.builder.call("call_function", fn, tuple(args), kwargs)
        if fn is copy.copy or fn is copy.deepcopy:
            return _copy(tracer, fn, args, kwargs)
        if fn.__module__ in _EVALUATED_PY_MODULES and not fn.__code__.co_flags & _CO_GENERATOR \
                and (fn.__module__ in ("inspect", "dataclasses") and fn.__name__ in _REFLECTIVE
                     or not (contains_tensor(args) or contains_tensor(kwargs))):
            tracer.identity_used(*args, *kwargs.values())
            return fn(*args, **kwargs)
        return inline(tracer, frame, fn, args, kwargs)
    if isinstance(fn, functools.partial):
        return call(tracer, frame, fn.func, [*fn.args, *args], {**fn.keywords, **kwargs})
    if isinstance(fn, type):
        return call_class(tracer, frame, fn, args, kwargs)
    if is_torch_op(fn):
        if custom_ops.writes_arguments(fn):
            return custom_ops.record(tracer, fn, args, kwargs)
        name = getattr(fn, "__name__", "")
        if any(isinstance(a, (types.FunctionType, types.MethodType))
               for a in (*args, *kwargs.values())):
            # C code that calls back into Python (torch._C._fx_map_arg, ...) is no tensor op:
            # on fake tensors it would hand fake results to the caller.
            raise Unsupported("unsupported call", f"torch.{name} calls a Python function")
        if name in _TORCH_SIDE_EFFECTS or name.lstrip("_").startswith("set_") or \
                name.endswith("_increment_nesting") or name.endswith("_decrement_nesting"):
            # (torch.func's transforms enter a level with _vmap_increment_nesting, ...)
            raise Unsupported("unsupported call", f"torch.{name} changes global state")
        if fn in _PURE_TORCH_QUERIES:
            return fn(*args, **kwargs)   # type/state queries: no graph node needed
        rewritten = scalar_tensors.rewrite_function(tracer.builder, fn, args, kwargs)
        if rewritten is not scalar_tensors.NOT_REWRITTEN:
            return rewritten
        return tracer.builder.call("call_function", fn, tuple(args), kwargs)
    return call_c(tracer, frame, fn, args, kwargs)


def is_torch_op(fn) -> bool:
    """Is ``fn`` an operation to record in the graph (rather than code to inline)?"""
    t = type(fn)
    if t is torch._ops.OpOverload or t is torch._ops.OpOverloadPacket:
        return True   # torch.ops.aten.add.Tensor, a torch.library.custom_op's overload
    if t is _BUILTIN_FUNCTION:
        mod = getattr(fn, "__module__", None) or ""
        if mod.startswith("torch._C._dynamo"):
            return False   # Dynamo's frame-evaluation and guard machinery: no tensor op
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


# A flag of a tensor argument that its guard checks (GuardSet.tensor) but fake tensors lack.
_INPUT_FLAG_METHODS = {"is_inference"}
_STORAGE_STATE_METHODS = {"is_shared", "is_pinned"}


def tensor_method(tracer, m: TensorMethod, args, kwargs):
    name, t = m.name, m.tensor
    if name in _TENSOR_METADATA_METHODS:
        if contains_tensor(args) or contains_tensor(kwargs):
            raise Unsupported("unsupported call", f"tensor.{name} with tensor arguments")
        real = tracer.builder.argument_tensor(t) if name in _INPUT_FLAG_METHODS else None
        if real is not None:   # fake tensors do not carry these flags; the guard checks them
            return getattr(real, name)()
        return getattr(t.fake, name)(*args, **kwargs)
    if name == "numpy":
        return numpy_values.tensor_to_numpy(tracer, t, args, kwargs)
    if name == "item" and not args and not kwargs:
        return scalars.item(tracer, t)
    if name == "tolist" and not args and not kwargs:
        return scalars.tolist(tracer, t)
    if name == "untyped_storage" and not args and not kwargs:
        return _storage_of(tracer, t)
    if name == "__iter__" and not args and not kwargs:
        from .interpreter import tensor_iter
        return tensor_iter(tracer.builder, t)
    if name in _TENSOR_DATA_METHODS:
        raise Unsupported("data-dependent value", f"tensor.{name}() needs the tensor's value")
    if name in _STORAGE_STATE_METHODS:   # a fake tensor's storage is never shared or pinned
        raise Unsupported("data-dependent value", f"tensor.{name}() reads the real storage")
    if name in ("backward", "register_hook", "retain_grad", "record_stream", "share_memory_"):
        raise Unsupported("unsupported call", f"tensor.{name}() inside a captured graph")
    if name == "type" and not args and not kwargs:
        return t.fake.type().replace("torch.", "torch.")  # a string like 'torch.FloatTensor'
    if name in ("cpu", "cuda", "to") and not _changes_anything(t, name, args, kwargs):
        return t
    rewritten = scalar_tensors.rewrite_method(tracer.builder, t, name, args, kwargs)
    if rewritten is not scalar_tensors.NOT_REWRITTEN:
        return rewritten
    return tracer.builder.call("call_method", name, (t, *args), kwargs)


# Operations after which a tensor's storage is another size than its input's was.
_STORAGE_CHANGING = {"resize_", "set_", "resize_as_", "untyped_storage"}


def _storage_of(tracer, t: TensorVar) -> StorageVar:
    """``t.untyped_storage()`` of a tensor the caller gave (argument, parameter, buffer),
    its size guarded (a view of a larger tensor has the shape of a smaller one). A storage
    the graph makes is known only when it runs: a graph break."""
    source = tracer.builder.input_source(t)
    changed = any(n.target in _STORAGE_CHANGING for n in tracer.builder.graph.nodes)
    if source is None or changed:
        raise Unsupported("data-dependent value", "tensor.untyped_storage() of a tensor "
                          "computed in the graph needs the real storage")
    tensor, expr = source
    nbytes = tensor.untyped_storage().nbytes()
    tracer.guards.add("shape", f"{expr}.untyped_storage().nbytes() == {nbytes}",
                      f"{expr}'s storage holds {nbytes} bytes")
    return StorageVar(t, nbytes)


def storage_attr(storage: StorageVar, name: str) -> StorageMethod:
    if name not in ("size", "nbytes"):
        raise Unsupported("data-dependent value", f"storage.{name} needs the real storage")
    return StorageMethod(storage, name)


def _call_with_out(tracer, fn, args, kwargs):
    """``torch.add(a, b, out=t)``: eager computes the result, writes it into ``t`` (cast to
    ``t``'s dtype) and returns ``t``. Recorded as the operation without ``out`` and
    ``t.copy_(result)`` where that is exactly what eager does: one tensor of the result's
    shape and device, a dtype the result casts to, no autograd; anything else (a resize,
    a tuple of outs, a cast eager refuses) stays in Python, as eager runs it."""
    name = getattr(fn, "__name__", fn)
    out = kwargs["out"]
    if not isinstance(out, TensorVar):
        raise Unsupported("unsupported call", f"{name}(out=...) with an out that is not one tensor")
    rest = {k: v for k, v in kwargs.items() if k != "out"}
    result = tracer.builder.call("call_function", fn, tuple(args), rest)
    if not isinstance(result, TensorVar) or not _fits_out(result.fake, out.fake):
        raise Unsupported("unsupported call", f"{name}(out=...) resizes, casts or records "
                          "autograd history in a way a copy into out does not")
    return tracer.builder.call("call_method", "copy_", (out, result), {})


def _fits_out(result, out) -> bool:
    """Does writing ``result`` into ``out`` leave what eager's out= variant leaves?"""
    return tuple(result.shape) == tuple(out.shape) and result.device == out.device and \
        result.layout == out.layout and torch.can_cast(result.dtype, out.dtype) and \
        not (torch.is_grad_enabled() and (result.requires_grad or out.requires_grad))


def _descriptor_get(tracer, frame, descriptor, args, kwargs):
    """``torch.Tensor.shape.__get__(x)``: a C attribute descriptor read on ``obj`` is
    ``obj.<name>`` wherever the class of ``obj`` finds that same descriptor under its name
    (then the attribute read is modelled, with its guards); elsewhere C code that is not
    known to be pure."""
    obj = args[0] if len(args) in (1, 2) and not kwargs else None
    cls = _tensor_type(tracer, obj) if isinstance(obj, TensorVar) else type(obj)
    if obj is None or inspect.getattr_static(cls, descriptor.__name__, None) is not descriptor:
        raise Unsupported("non-torch library call", f"{type(descriptor).__name__}.__get__ of "
                          f"{descriptor.__objclass__.__name__}.{descriptor.__name__} on a "
                          f"{cls.__name__}")
    return tracer.load_attr(obj, descriptor.__name__, frame)


def _changes_anything(t: TensorVar, name, args, kwargs) -> bool:
    if name == "cpu":
        return t.fake.device.type != "cpu"
    return True


_MODULE_CALL_IMPL = torch.nn.Module._call_impl


def call_module(tracer, frame, mod: torch.nn.Module, args, kwargs):
    if isinstance(mod, LazyModuleMixin) and mod.has_uninitialized_params():
        _materialize_lazy(mod, args, kwargs)
    if _guard_module_class(tracer, mod):
        # an overridden __call__ runs instead of Module.__call__ (and may call super's)
        return call(tracer, frame, type(mod).__call__, [mod, *args], kwargs)
    return call(tracer, frame, guard_module_call(tracer, mod), list(args), kwargs)


def _materialize_lazy(mod, args, kwargs):
    """A lazy module's first call (nn.LazyLinear): its pre-hook creates the parameters from
    the input shapes and turns it into the plain module, once, as eager's first call does.
    It runs here on zero tensors of the inputs' shapes; the graph then calls the plain one."""
    def example(v):
        if isinstance(v, TensorVar):
            if any(isinstance(d, torch.SymInt) for d in v.fake.shape):
                raise Unsupported("lazy module initialisation", "a lazy module's first call with "
                                                                "symbolic input sizes")
            return torch.zeros(v.fake.shape, dtype=v.fake.dtype, device=v.fake.device)
        if type(v) in (list, tuple):
            return type(v)(example(i) for i in v)
        return v
    try:
        mod._infer_parameters(mod, tuple(example(a) for a in args),
                              {k: example(v) for k, v in kwargs.items()})
    except Exception as e:   # eager's first call raises the same
        raise UserError(e) from None


def _module_call_body(tracer, frame, args, kwargs):
    """``Module.__call__(m, ...)`` reached from an overridden ``__call__``'s
    ``super().__call__``: hooks (guarded absent), then forward."""
    mod = args[0]
    return call(tracer, frame, guard_module_call(tracer, mod), list(args[1:]), kwargs)


_SPECIAL = {
    _MODULE_CALL: _module_call_body,
    _MODULE_CALL_IMPL: _module_call_body,
}
_SPECIAL.update(calls_builtins.MODELS)
_SPECIAL.update(stdlib.MODELS)
_SPECIAL.update(GUARDED_READERS)
_SPECIAL.update(higher_order.MODELS)
_SPECIAL.update(autograd_function.MODELS)
_SPECIAL[torch.cond] = cond.cond
_SPECIAL.update({t: func_transforms.model(t) for t in func_transforms.TRANSFORMS})
_SPECIAL.update(func_transforms.MODELS)
_SPECIAL[torch.vmap] = higher_order.vmap_model(is_torch_op)
