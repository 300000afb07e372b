"""What calling a value does during capture.

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
"""
from __future__ import annotations

import builtins
import collections
import copy
import functools
import inspect
import logging
import math
import operator
import sys
import types
import warnings

import torch
import torch.optim.optimizer as torch_optimizer
from torch.nn.modules.lazy import LazyModuleMixin

from . import cache, context, higher_order, numpy_values, scalar_tensors, scalars, shapes, stdlib
from .breaks import Unsupported, UserError
from .instructions import PY
from .module_guards import _MODULE_CALL, _guard_module_class, guard_function, guard_module_call
from .purity import _BUILTIN_FUNCTION, _IMPURE_BUILTINS, _PLAIN_TYPES, _PURE_C_CLASSES, \
    GUARDED_READERS, _PURE_C_MODULES, _PURE_C_TYPES, _check_pure_arguments, _check_pure_owner, \
    _impure_reason, _read_environ, _reads_environ
from .values import CapturedIter, LazyIter, NdarrayMethod, NdarrayVar, ScalarVar, TensorVar, \
    StorageMethod, StorageVar, TensorMethod, SuperProxy, bound_self, check_own_iterator, \
    contains_tensor

# Values whose content is only known when the graph runs: never turned into Python values.
_SYMBOLIC = (TensorVar, NdarrayVar, ScalarVar)

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

_MUTATING_METHODS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                     "update", "setdefault", "popitem", "__setitem__", "__delitem__", "add",
                     "discard", "__iadd__", "__setattr__", "__delattr__", "appendleft",
                     "extendleft", "popleft", "rotate", "move_to_end"}
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
_METHOD_DESCRIPTOR = type(str.join)
_WRAPPER_DESCRIPTORS = (type(object.__init__), type(object().__str__), type(dict.__dict__["fromkeys"]))


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
    if numpy_values.is_numpy_callable(fn):
        return numpy_values.call_numpy(tracer, fn, args, kwargs)
    if numpy_values.holds_array((args, kwargs)):
        if fn in numpy_values._FROM_NUMPY and numpy_values.is_array(args[0] if args else None):
            return numpy_values.from_numpy(tracer, fn, args, kwargs)
        if is_torch_op(fn):
            raise Unsupported("non-torch library call", f"{getattr(fn, '__name__', fn)}() given "
                              "a numpy array runs in Python")
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
    higher_order.check_not_autograd_function(fn)
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


def _key(fn):
    try:
        hash(fn)
        return fn
    except TypeError:
        return None


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
        from .interpreter import GeneratorRun
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
    from .interpreter import GeneratorRun
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
    from .tracer import is_library_module
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
            not mod.startswith("torch.distributions"):
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
        return tracer.mark_internal(cls(*args, **kwargs))
    return _instantiate(tracer, frame, cls, args, kwargs)


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


def _new_module(tracer, frame, cls, args, kwargs):
    """A module built in forward (``nn.Softmax(dim=-1)(x)``): built as Python builds it,
    its ``__init__`` traced, then called like any module. One with parameters or buffers
    is refused: eager makes new ones (new random weights) on every call."""
    mod = _instantiate(tracer, frame, cls, args, kwargs)
    if any(True for _ in mod.parameters()) or any(True for _ in mod.buffers()):
        raise Unsupported("module created in forward", f"creating a {cls.__name__} module with "
                                                       "parameters or buffers in forward")
    return mod


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
            warnings.warn(f"tempa: a call to the functools.lru_cache-wrapped function "
                          f"{getattr(fn, '__qualname__', fn)} is captured by running its body; "
                          "its cache is neither read nor filled by the compiled code",
                          stacklevel=2)
            return call(tracer, frame, fn.__wrapped__, args, kwargs)
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
        return call(tracer, frame, type(fn).__call__, [fn, *args], kwargs)
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
    tracer.identity_used(*_identity_arguments(fn, args, kwargs))
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
    if not (isinstance(owner, _PLAIN_TYPES) or tracer.is_internal(owner)):
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
    if kwargs or len(args) != 2:
        _user_error(isinstance, *[None] * len(args), **kwargs)   # eager's TypeError
    value, cls = args
    if isinstance(value, TensorVar):
        return issubclass(_tensor_type(tracer, value), cls)
    if type(value) is NdarrayVar:
        return issubclass(numpy_values.python_type(value), cls)
    if type(value) is ScalarVar:
        return issubclass(type(value.example), cls)
    if type(value) is LazyIter:
        return issubclass(value.kind, cls)
    return isinstance(value, cls)


def _type(tracer, frame, args, kwargs):
    if len(args) == 1 and isinstance(args[0], TensorVar):
        return _tensor_type(tracer, args[0])
    if len(args) == 1 and type(args[0]) is NdarrayVar:
        return numpy_values.python_type(args[0])
    if len(args) == 1 and type(args[0]) is ScalarVar:
        return type(args[0].example)
    if len(args) == 1:
        return args[0].kind if type(args[0]) is LazyIter else type(args[0])
    raise Unsupported("class created in forward", "type() with three arguments")


def _len(tracer, frame, args, kwargs):
    (v,) = args
    if isinstance(v, TensorVar):
        if v.fake.dim() == 0:
            from .breaks import UserError
            raise UserError(TypeError("len() of a 0-d tensor"))
        return v.fake.shape[0]
    if type(v) is NdarrayVar:
        if v.tensor.fake.dim() == 0:
            from .breaks import UserError
            raise UserError(TypeError("len() of unsized object"))
        return v.tensor.fake.shape[0]
    if isinstance(v, torch.nn.Module):
        tracer.guard_module_contents(v)
        return len(v)
    _check_pure_arguments(args, kwargs, "len()")
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
    frame.delete_attr(obj, name)
    return None


def _iter(tracer, frame, args, kwargs):
    if len(args) == 1 and type(args[0]) in _PLAIN_ITERABLES:
        return tracer.mark_internal(iter(args[0]))   # a range_iterator for a range, ...
    return frame.get_iter(args[0])


_PLAIN_ITERABLES = {list, tuple, range, str, bytes, dict, set, frozenset, type({}.items()),
                    type({}.keys()), type({}.values())}


def _next(tracer, frame, args, kwargs):
    it = args[0] if args else None
    if len(args) == 1 and not kwargs and type(it) is not CapturedIter and \
            not tracer.is_internal(it):
        return tracer.side_effects.advance_outside_iterator(tracer.guards, it)
    check_own_iterator(tracer, it, "next()")
    return next(*args)


def _fx_map_aggregate(tracer, frame, args, kwargs):
    """torch.fx's map_aggregate (C code calling ``fn`` back), as its Python version reads:
    ``fn`` applied to each leaf of tuples, lists, dicts and slices, traced."""
    from torch.fx.immutable_collections import immutable_dict, immutable_list
    a, fn = args

    def walk(v):
        if isinstance(v, tuple):
            items = tuple(walk(e) for e in v)
            return type(v)(*items) if hasattr(v, "_fields") else items
        if isinstance(v, list):
            return tracer.mark_internal(immutable_list(walk(e) for e in v))
        if isinstance(v, dict):
            out = tracer.mark_internal(immutable_dict())
            for k, e in v.items():
                dict.__setitem__(out, k, walk(e))
            return out
        if isinstance(v, slice):
            return slice(walk(v.start), walk(v.stop), walk(v.step))
        return frame.call(fn, [v], {})
    return walk(a)


def _tuple_new(tracer, frame, args, kwargs):
    """``tuple.__new__(cls, iterable)``, which every namedtuple's ``__new__`` and ``_make``
    call: the tuple only stores its items (tensors included), iterated as the frame iterates;
    a subclass instance is an object of this capture (its attributes are tracked)."""
    if kwargs or not 1 <= len(args) <= 2 or not (isinstance(args[0], type) and
                                                 issubclass(args[0], tuple)):
        return _user_error(tuple.__new__, *args, **kwargs)
    items = list(frame.get_iter(args[1])) if len(args) == 2 else []
    result = tuple.__new__(args[0], items)
    return result if args[0] is tuple else tracer.mark_internal(result)


def _namedtuple(tracer, frame, args, kwargs):
    """``collections.namedtuple(...)`` run in compiled code: made now from its constant
    arguments (its code uses eval and sys._getframe, which capture does not interpret). It
    is a new class on every eager call: where it, or an instance of it, leaves the capture
    the entry makes it again (``tracer.recipes``), so no class is shared between calls."""
    if contains_tensor(args) or contains_tensor(kwargs):
        raise Unsupported("unsupported call", "collections.namedtuple with tensor arguments")
    kwargs = dict(kwargs)
    if kwargs.get("module") is None:   # what sys._getframe(1) would have found
        kwargs["module"] = frame.f_globals.get("__name__", "__main__")
    cls = _user_error(collections.namedtuple, *args, **kwargs)
    tracer.mark_internal(cls)
    tracer.mark_internal(cls.__new__)
    tracer.recipes[id(cls)] = (cls, collections.namedtuple, tuple(args), kwargs)
    return cls


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
        if any(isinstance(v, _SYMBOLIC) for v in items):
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
    if type(args[0]) is NdarrayVar:
        return numpy_values.operator_call(tracer, operator.abs, (args[0],))
    if type(args[0]) is ScalarVar:
        return scalars.operator_call(tracer, operator.abs, (args[0],))
    return abs(args[0])


def _to_python_number(kind):
    def handler(tracer, frame, args, kwargs):
        if args and isinstance(args[0], _SYMBOLIC):
            raise Unsupported("data-dependent value", f"{kind.__name__}(tensor) needs its value")
        return kind(*args, **kwargs)
    return handler


def _map(tracer, frame, args, kwargs):
    fn, *iterables = args
    its = [frame.get_iter(i) for i in iterables]
    inner = _user_error(map, lambda *items: frame.call(fn, list(items), {}), *its, **kwargs)
    return tracer.mark_internal(LazyIter(map, fn, its, kwargs, inner))


def _filter(tracer, frame, args, kwargs):
    fn, iterable = args
    it = frame.get_iter(iterable)
    keep = frame.truth if fn is None else (lambda v: frame.truth(frame.call(fn, [v], {})))
    inner = _user_error(filter, keep, it, **kwargs)
    return tracer.mark_internal(LazyIter(filter, fn, [it], kwargs, inner))


def _user_error(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; the TypeError of a bad call (map(..., strict=True) before
    3.14) is the user's error, raised as eager raises it."""
    try:
        return fn(*args, **kwargs)
    except TypeError as e:
        from .breaks import UserError
        raise UserError(e) from None


def _sorted(tracer, frame, args, kwargs):
    items = list(frame.get_iter(args[0]))
    key = kwargs.get("key")
    if isinstance(key, types.FunctionType):
        keys = [frame.call(key, [v], {}) for v in items]
        order = sorted(range(len(items)), key=lambda i: keys[i], reverse=kwargs.get("reverse", False))
        return [items[i] for i in order]
    return sorted(items, **kwargs)


def _enumerate(tracer, frame, args, kwargs):
    return tracer.mark_internal(_user_error(enumerate, frame.get_iter(args[0]), *args[1:],
                                            **kwargs))


def _zip(tracer, frame, args, kwargs):
    its = [frame.get_iter(a) for a in args]
    return tracer.mark_internal(LazyIter(zip, None, its, kwargs, _user_error(zip, *its, **kwargs)))


def _reversed(tracer, frame, args, kwargs):
    v = args[0]
    if isinstance(v, TensorVar):
        raise Unsupported("unsupported call", "reversed(tensor)")
    if isinstance(v, torch.nn.Module):
        return iter(list(frame.get_iter(v))[::-1])
    _check_pure_arguments(args, kwargs, "reversed()")
    return tracer.mark_internal(reversed(v))


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
    return isinstance(v, (TensorMethod, NdarrayMethod)) or (not isinstance(v, _SYMBOLIC) and callable(v))


def _id(tracer, frame, args, kwargs):
    if isinstance(args[0], _SYMBOLIC):
        raise Unsupported("unsupported call", "id() of a tensor")
    return id(args[0])


def _locals(tracer, frame, args, kwargs):
    """``locals()``: the frame's bound names, in CPython's order (arguments and locals,
    then cells, then free variables). 3.13 returns a new snapshot on each call; 3.11/3.12
    return one dict per frame, brought up to date by each call (PyFrame_FastToLocals)."""
    if args or kwargs:
        raise UserError(TypeError(f"locals() takes no arguments ({len(args)} given)"))
    code = frame.code
    out = frame.locals_dict if frame.locals_dict is not None and PY < (3, 13) else {}
    for name in code.co_varnames:
        if name in frame.locals:
            out[name] = frame.locals[name]
        else:
            out.pop(name, None)
    for name in (*code.co_cellvars, *code.co_freevars):
        try:
            out[name] = frame.cells[name].cell_contents
        except (KeyError, ValueError):   # an empty cell is not listed, as in eager
            out.pop(name, None)
    frame.locals_dict = out
    return tracer.mark_internal(out)


def _vars(tracer, frame, args, kwargs):
    """``vars()`` is ``locals()``; ``vars(obj)`` reads ``obj.__dict__`` as the attribute
    read does (an outside object's dict is guarded and copied)."""
    if not args and not kwargs:
        return _locals(tracer, frame, args, kwargs)
    if len(args) != 1 or kwargs:
        raise UserError(TypeError(f"vars expected at most 1 argument, got {len(args)}"))
    try:
        return tracer.load_attr(args[0], "__dict__", frame)
    except AttributeError:
        raise UserError(TypeError("vars() argument must have __dict__ attribute")) from None


def _is_compiling(tracer, frame, args, kwargs):
    return True


def _false(tracer, frame, args, kwargs):
    return False


def _grad_enabled(tracer, frame, args, kwargs):
    return torch.is_grad_enabled()


def _set_grad_enabled_fn(tracer, frame, args, kwargs):
    return context.make(tracer, torch.set_grad_enabled, args, kwargs)


def _builtin_type(tracer, frame, cls, args, kwargs):
    if cls is not type:
        _check_pure_arguments(args, kwargs, f"{cls.__name__}()")
    if cls in (list, tuple, set, frozenset) and args:
        items = list(frame.get_iter(args[0]))
        return cls(items)
    if cls is dict:
        if args and isinstance(args[0], TensorVar):
            raise Unsupported("unsupported call", "dict(tensor)")
        return dict(*args, **kwargs)
    if cls in (int, float, bool) and len(args) == 1 and not kwargs and \
            isinstance(args[0], TensorVar):
        return scalars.item(tracer, args[0], cls)
    if cls in (int, float) and len(args) == 1 and not kwargs and type(args[0]) is NdarrayVar:
        return numpy_values.as_number(tracer, args[0], cls)
    if cls in (int, float, bool, complex) and args and isinstance(args[0], _SYMBOLIC):
        raise Unsupported("data-dependent value", f"{cls.__name__}(tensor) needs its value")
    if cls is bool and args:
        return frame.truth(args[0])
    if cls is str and args and isinstance(args[0], _SYMBOLIC):
        raise Unsupported("data-dependent value", "str(tensor) needs its value")
    if cls is str:
        args = [shapes.specialized(a) for a in args]   # str(size): its value, not its symbol
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

def _module_call_body(tracer, frame, args, kwargs):
    """``Module.__call__(m, ...)`` reached from an overridden ``__call__``'s
    ``super().__call__``: hooks (guarded absent), then forward."""
    mod = args[0]
    return call(tracer, frame, guard_module_call(tracer, mod), list(args[1:]), kwargs)


_SPECIAL = {
    _MODULE_CALL: _module_call_body,
    _MODULE_CALL_IMPL: _module_call_body,
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
    builtins.locals: _locals,
    builtins.vars: _vars,
    builtins.id: _id,
    builtins.round: _to_python_number(round),
    math.sqrt: _to_python_number(math.sqrt),
    torch.compiler.is_compiling: _is_compiling,
    torch_optimizer._get_value: scalar_tensors.optimizer_value,
    torch.compiler.is_dynamo_compiling: _is_compiling,
    torch.jit.is_scripting: _false,
    torch.jit.is_tracing: _false,
    torch._C._get_tracing_state: lambda *a: None,
    torch._C._log_api_usage_once: lambda *a: None,   # usage telemetry of Module.__init__
    torch.is_grad_enabled: _grad_enabled,
    torch._C._fx_map_aggregate: _fx_map_aggregate,
    tuple.__new__: _tuple_new,
    collections.namedtuple: _namedtuple,
    torch._C.is_grad_enabled: _grad_enabled,
    torch._check: scalars.check,
}
_SPECIAL.update(stdlib.MODELS)
_SPECIAL.update(GUARDED_READERS)
_SPECIAL.update(higher_order.MODELS)
_SPECIAL[torch.vmap] = higher_order.vmap_model(is_torch_op)
for _name in ("is_exporting",):
    if hasattr(torch.compiler, _name):
        _SPECIAL[getattr(torch.compiler, _name)] = _false
