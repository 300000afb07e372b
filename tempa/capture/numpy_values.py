"""numpy inside captured code, traced as torch operations (as torch.compile does).

An ndarray whose data lives in the graph is an ``NdarrayVar``: a TensorVar holding its
data plus whether eager would have a numpy *scalar* there (``np.float64``, what a full
reduction or ``a[0]`` of a 1-d array gives) rather than an array. Where they come from:

- ``x.numpy()`` of a CPU tensor without grad: the same TensorVar (eager's ndarray shares
  the tensor's memory, and so does the one rebuilt from it);
- an ndarray read from outside (argument, global, closure): a graph input
  ``torch.from_numpy(a)``, read on every call and guarded like a tensor (dtype, shape,
  strides), so a new array of the same layout needs no recompile;
- a numpy function, method, attribute or operator applied to them, or a numpy function of
  constants (``np.ones(3)``): one graph node each, whose target runs the torch._numpy
  counterpart (numpy's API written in torch ops) on ``tnp.ndarray`` views of its tensor
  arguments and hands back tensors. Fake tensors give the result's metadata; the backend
  traces the torch ops inside like any other.

``torch.from_numpy`` / ``torch.as_tensor`` of one is a view of its tensor. A returned (or
at a graph break live) one is rebuilt as a real ``np.ndarray`` over the graph's output
(``output.py``); an input array comes back as itself. What has no torch equivalent
(``np.random``, ``tolist``, strides, an operator mixing a tensor and an array, a value
Python must see) is a graph break, and Python runs it on real arrays.
"""
from __future__ import annotations

import functools
import operator
import warnings

import torch
from torch.utils._pytree import tree_map

try:
    import numpy as np
    import torch._numpy as tnp
except ImportError:   # numpy is optional: without it no value is an ndarray
    np = tnp = None

from .breaks import Unsupported
from .values import NdarrayVar, NdarrayMethod, TensorVar

# numpy namespaces and their torch._numpy counterparts.
_NAMESPACES = {"numpy": tnp, "numpy.linalg": tnp.linalg, "numpy.fft": tnp.fft} if tnp else {}
# Functions whose 0-d result is a 0-d array in eager (everything else gives a numpy scalar:
# ufuncs, reductions, a[0]).
_KEEPS_0D = {"array", "asarray", "asanyarray", "ascontiguousarray", "copy", "reshape", "zeros",
             "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like",
             "squeeze", "transpose", "astype", "view", "swapaxes", "moveaxis", "real", "imag",
             "conj", "conjugate", "T", "__getitem__"}
# Functions of constants that answer about dtypes or shapes: evaluated by numpy itself.
_METADATA_FUNCTIONS = {"result_type", "promote_types", "can_cast", "issubdtype", "dtype",
                       "finfo", "iinfo", "isscalar", "ndim", "shape"}
# Methods that need the values in Python, or state tempa does not model.
_VALUE_METHODS = {"item", "tolist", "tobytes", "tostring", "tofile", "dump", "dumps",
                  "__array__", "__array_interface__", "__index__", "__int__", "__float__",
                  "__bool__", "__format__", "__repr__", "__str__", "setflags", "resize",
                  "itemset", "byteswap", "getfield", "setfield", "ctypes", "data", "base",
                  "flags", "strides", "flat", "__reduce__", "__deepcopy__", "__copy__"}
_INPLACE_METHODS = {"fill", "sort", "put", "partition"}
# Functions that write into an argument and return None.
_INPLACE_FUNCTIONS = {"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"}


def is_array(value) -> bool:
    return type(value) is NdarrayVar


def is_ndarray(value) -> bool:
    """A real numpy array (read from outside the call)."""
    return np is not None and type(value) is np.ndarray


# -- graph node targets: torch._numpy code over tensors -------------------------------------

def _to_tnp(v):
    return tnp.ndarray(v) if isinstance(v, torch.Tensor) else v


def _from_tnp(v):
    if isinstance(v, tnp.ndarray):
        return v.tensor
    if isinstance(v, tnp.DType):
        return np.dtype(v.name)
    if isinstance(v, (tuple, list)):
        return type(v)(_from_tnp(x) for x in v)
    return v


def _named(fn, name: str):
    fn.__name__ = fn.__qualname__ = name
    return fn


@functools.cache
def numpy_function(fn, inplace: bool = False):
    """The node target for the torch._numpy function ``fn``; an in-place one's name ends
    in ``_``, which keeps the node (it returns nothing) and marks it as a mutation."""
    def run(*args, **kwargs):
        return _from_tnp(fn(*tree_map(_to_tnp, args), **tree_map(_to_tnp, kwargs)))
    return _named(run, f"numpy_{fn.__name__}{'_' if inplace else ''}")


@functools.cache
def numpy_method(name: str, inplace: bool = False):
    """The node target for ``array.name(...)``; an in-place one's name ends in ``_``, which
    keeps the node (it returns nothing) and marks it as a mutation."""
    def run(array, *args, **kwargs):
        return _from_tnp(getattr(tnp.ndarray(array), name)(*tree_map(_to_tnp, args),
                                                          **tree_map(_to_tnp, kwargs)))
    return _named(run, f"numpy_{name.strip('_')}{'_' if inplace else ''}")


@functools.cache
def numpy_attribute(name: str):
    def run(array):
        return _from_tnp(getattr(tnp.ndarray(array), name))
    return _named(run, f"numpy_attr_{name}")


@functools.cache
def numpy_operator(op):
    def run(*args):
        return _from_tnp(op(*(_to_tnp(a) for a in args)))
    return _named(run, f"numpy_{op.__name__.strip('_')}")


def numpy_array_of(items, dtype=None):
    """``np.array([a, b, ...])`` of arrays and numbers: their stack, as numpy builds it."""
    out = tnp.stack([tnp.asarray(_to_tnp(v)) for v in items])
    return (out if dtype is None else out.astype(dtype)).tensor


def numpy_setitem_(array, key, value):
    tnp.ndarray(array)[tree_map(_to_tnp, key)] = _to_tnp(value)


# -- the entry's side: ndarrays in and out ---------------------------------------------------

def array_as_tensor(a):
    """The tensor over an input ndarray's memory, made on every call (torch.from_numpy
    warns about read-only arrays; the graph never writes one that eager would not)."""
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def to_numpy(t: torch.Tensor, scalar: bool):
    """The real ndarray (or numpy scalar) a graph output stands for."""
    a = t.numpy(force=True)
    return a[()] if scalar else a


def external_dtype_info(tracer, value, expr: str) -> bool:
    """A numpy dtype, or the ``np.finfo``/``np.iinfo`` of one, read at ``expr``: guarded by
    equality (equal dtypes made in different ways are one graph), True; else False."""
    g, t = tracer.guards, type(value)
    if np is None:
        return False
    if t is np.dtype:
        g.add("constant", f"{expr}.__class__ is {g.const(t, 'T')} and {expr} == "
              f"{g.const(value, 'V')}", f"{expr} == {value!r}")
        return True
    if t is np.finfo or t is np.iinfo:
        g.add("constant", f"{expr}.__class__ is {g.const(t, 'T')} and {expr}.dtype == "
              f"{g.const(value.dtype, 'V')}", f"{expr} is {t.__name__}({value.dtype})")
        return True
    return False


def external_array(tracer, value: np.ndarray, expr: str) -> NdarrayVar:
    """An ndarray read at ``expr``: a graph input over its memory, guarded like a tensor."""
    seen = tracer.ndarrays.get(id(value))
    if seen is not None and seen[0] is value:
        return seen[1]
    try:
        tensor = array_as_tensor(value)
    except (TypeError, ValueError) as e:
        raise Unsupported("non-torch library call", f"{expr[:60]}: an ndarray torch cannot "
                          f"hold ({e})") from None
    g = tracer.guards
    g.add("identity", f"{expr}.__class__ is {g.const(np.ndarray, 'T')}", f"{expr} is an ndarray")
    writeable = bool(value.flags.writeable)
    g.add("identity", f"{expr}.flags.writeable is {writeable}",
          f"{expr} is {'' if writeable else 'not '}writeable")
    texpr = f"{g.const(array_as_tensor, 'F')}({expr})"
    var = NdarrayVar(tracer.builder.user_input(tensor, texpr, tracer.dynamic_dims(tensor, texpr)),
                     source=expr, readonly=not writeable)
    tracer.ndarrays[id(value)] = (value, var)
    return var


# -- what capture does with them ------------------------------------------------------------

def tensor_to_numpy(tracer, t: TensorVar, args, kwargs) -> NdarrayVar:
    force = kwargs.get("force", args[0] if args else False)
    fake = t.fake
    if fake.device.type != "cpu" or fake.dtype is torch.bfloat16 or \
            (fake.requires_grad and not force):
        # eager raises (or copies to the host): Python runs it
        raise Unsupported("data-dependent value", f"tensor.numpy() of a {fake.dtype} tensor on "
                          f"{fake.device} (requires_grad={fake.requires_grad}) runs in Python")
    if fake.is_conj() if fake.is_complex() else False:
        raise Unsupported("data-dependent value", "tensor.numpy() of a conjugate view")
    if fake.requires_grad:
        t = tracer.builder.call("call_method", "detach", (t,), {})
    return NdarrayVar(t)


def _dtype_name(dtype):
    """A numpy dtype, scalar type or Python number type as the name torch._numpy takes."""
    if isinstance(dtype, np.dtype):
        return dtype.name
    if isinstance(dtype, type) and (issubclass(dtype, np.generic) or
                                    dtype in (bool, int, float, complex)):
        return np.dtype(dtype).name
    return dtype


def _graph_args(value):
    """Call arguments with arrays as their tensors and numpy dtypes by name (what
    torch._numpy accepts)."""
    if type(value) is NdarrayVar:
        return value.tensor
    if isinstance(value, TensorVar):
        if value.fake.requires_grad or value.fake.device.type != "cpu":
            raise Unsupported("non-torch library call", "a tensor that requires grad or lives "
                              "off the CPU passed to numpy (eager raises)")
        return value
    if isinstance(value, (np.dtype, type)) and _dtype_name(value) is not value:
        return _dtype_name(value)
    if type(value) in (tuple, list):
        return type(value)(_graph_args(v) for v in value)
    if type(value) is dict:
        return {k: _graph_args(v) for k, v in value.items()}
    if type(value) is slice:
        return slice(_graph_args(value.start), _graph_args(value.stop), _graph_args(value.step))
    if isinstance(value, np.ndarray):
        raise Unsupported("non-torch library call", "an ndarray made outside the graph's view")
    return value


def _wrap(result, name: str, keep: NdarrayVar | None = None):
    """Graph results as arrays: 0-d ones as numpy scalars where eager has a scalar."""
    if isinstance(result, TensorVar):
        if keep is not None and result is keep.tensor:
            return keep   # an in-place operator (a += 1) returns the array itself
        return NdarrayVar(result, scalar=result.fake.dim() == 0 and name not in _KEEPS_0D)
    if isinstance(result, (tuple, list)):
        return type(result)(_wrap(r, name) for r in result)
    return result


def is_numpy_callable(fn) -> bool:
    """A function of numpy's public namespaces, C or Python (``np.ones``: numpy's own
    ``copyto`` inside it would be a write; numpy's private helpers, such as the ``iinfo.max``
    property, are interpreted like any Python code)."""
    if np is None:
        return False
    if isinstance(fn, np.ufunc) or fn is np.finfo or fn is np.iinfo or \
            isinstance(fn, type) and issubclass(fn, np.generic):   # np.float32(2.5)
        return True
    mod = getattr(fn, "__module__", None)
    return isinstance(mod, str) and (mod in _NAMESPACES or mod.startswith("numpy.random")) and \
        callable(fn) and not isinstance(fn, type)


def call_numpy(tracer, fn, args, kwargs):
    """``np.<fn>(...)`` met during capture."""
    mod = getattr(fn, "__module__", None) or "numpy"
    name = getattr(fn, "__name__", "?")
    if mod.startswith("numpy.random"):
        raise Unsupported("impure call", f"numpy.random.{name} draws from numpy's own generator")
    if name in _METADATA_FUNCTIONS and not _holds_symbolic((args, kwargs)):
        return fn(*args, **kwargs)
    target = getattr(tnp, name, None) if isinstance(fn, np.ufunc) else \
        getattr(_NAMESPACES.get(mod), name, None)
    if target is None:
        raise Unsupported("non-torch library call", f"{mod}.{name} has no torch equivalent")
    if kwargs.get("out") is not None:
        raise Unsupported("non-torch library call", f"{mod}.{name}(out=...) writes into an array")
    if not _holds_symbolic((args, kwargs)):
        return _constant_call(tracer, fn, args, kwargs)
    if name in ("array", "asarray") and type(args[0]) in (list, tuple) and args[0] and \
            not any(type(v) in (list, tuple) for v in args[0]) and set(kwargs) <= {"dtype"}:
        result = tracer.builder.call("call_function", numpy_array_of,
                                     (_graph_args(list(args[0])), *_graph_args(tuple(args[1:]))),
                                     _graph_args(kwargs))
    else:
        if name in _INPLACE_FUNCTIONS and args:
            _check_writeable(args[0])
        result = tracer.builder.call("call_function",
                                     numpy_function(target, name in _INPLACE_FUNCTIONS),
                                     _graph_args(tuple(args)), _graph_args(kwargs))
    return _wrap(result, name)


def _constant_call(tracer, fn, args, kwargs):
    """A numpy function of constants (guarded) that torch._numpy also has, so pure array
    code: numpy computes it now; an array result becomes a constant of the graph, copied
    on every call (the caller may write into what it is returned)."""
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        from .breaks import UserError
        raise UserError(e) from None
    if not isinstance(result, np.ndarray):
        return result
    try:
        constant = tracer.builder.attr_input(torch.from_numpy(result), "np_constant")
    except TypeError as e:
        raise Unsupported("non-torch library call", f"an ndarray torch cannot hold ({e})") from None
    return NdarrayVar(tracer.builder.call("call_method", "clone", (constant,), {}))


def array_attr(tracer, a: NdarrayVar, name: str):
    fake = a.tensor.fake
    if name == "shape":
        return tuple(fake.shape)
    if name == "ndim":
        return fake.dim()
    if name == "size":
        return fake.numel()
    if name == "dtype":
        return numpy_dtype(fake.dtype)
    if name == "itemsize":
        return fake.element_size()
    if name == "nbytes":
        return fake.numel() * fake.element_size()
    if name == "strides" and a.tensor.node.op == "placeholder":
        # an input's layout is guarded; a computed array's is the backend's choice
        return tuple(s * fake.element_size() for s in fake.stride())
    if name in _VALUE_METHODS and name not in ("item", "tolist"):   # captured numbers
        raise Unsupported("non-torch library call", f"ndarray.{name} has no torch equivalent")
    if name in ("T", "real", "imag", "mT"):
        result = tracer.builder.call("call_function", numpy_attribute(name), (a.tensor,), {})
        return _wrap(result, name if not a.scalar else "")
    if callable(getattr(np.ndarray, name, None)) and hasattr(tnp.ndarray, name):
        return NdarrayMethod(a, name)
    if hasattr(np.ndarray, name):
        raise Unsupported("non-torch library call", f"ndarray.{name} has no torch equivalent")
    raise AttributeError(f"'numpy.ndarray' object has no attribute '{name}'")


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype is torch.bfloat16:
        raise Unsupported("non-torch library call", "numpy has no bfloat16")
    return torch.empty(0, dtype=dtype).numpy().dtype


def call_method(tracer, m: NdarrayMethod, args, kwargs):
    name, a = m.name, m.array
    if name == "item" and not args and not kwargs and a.tensor.fake.numel() == 1:
        return as_number(tracer, a)
    if name == "tolist" and not args and not kwargs:
        from . import scalars
        return scalars.tolist(tracer, a.tensor)
    if name in _VALUE_METHODS:
        raise Unsupported("data-dependent value", f"ndarray.{name}() needs the array's values")
    if kwargs.get("out") is not None:
        raise Unsupported("non-torch library call", f"ndarray.{name}(out=...) writes into an array")
    inplace = name in _INPLACE_METHODS
    if inplace:
        _check_writeable(a)
    result = tracer.builder.call("call_function", numpy_method(name, inplace),
                                 (a.tensor, *_graph_args(tuple(args))), _graph_args(kwargs))
    return None if inplace else _wrap(result, name)


def as_number(tracer, a: NdarrayVar, kind: type | None = None):
    """``a.item()`` / ``float(a)`` / ``int(a)`` of a one-element array: a captured Python
    number (numpy's ``item`` gives the same Python type as torch's)."""
    from . import scalars
    if a.tensor.fake.numel() != 1:
        raise Unsupported("data-dependent value", "a number from an array of several elements")
    return scalars.item(tracer, a.tensor, kind)


def _check_writeable(a) -> None:
    if is_array(a) and a.readonly:
        # numpy raises "assignment destination is read-only": Python runs it
        raise Unsupported("non-torch library call", "a write into a read-only array")


def operator_call(tracer, op, operands: tuple, inplace: bool = False):
    """A Python operator (binary, comparison, unary) with an array operand."""
    if inplace:
        _check_writeable(operands[0])
    if any(isinstance(v, TensorVar) for v in operands):
        if all(v.scalar for v in operands if is_array(v)):
            # torch takes a numpy scalar as a Python number (tensor + np.float32(2))
            from . import scalars
            operands = tuple(scalars.item(tracer, v.tensor) if is_array(v) else v
                             for v in operands)
            return tracer.builder.call("call_function", op, operands, {})
        raise Unsupported("non-torch library call", "an operator between a tensor and a numpy "
                          "array (eager mixes the two libraries)")
    result = tracer.builder.call("call_function", numpy_operator(op), _graph_args(operands), {})
    return _wrap(result, op.__name__, keep=operands[0] if inplace else None)


def getitem(tracer, a: NdarrayVar, key):
    result = tracer.builder.call("call_function", numpy_operator(operator.getitem),
                                 (a.tensor, _graph_args(key)), {})
    keeps = key is Ellipsis or (isinstance(key, tuple) and Ellipsis in key)
    return _wrap(result, "__getitem__" if keeps or a.scalar else "getitem")


def setitem(tracer, a: NdarrayVar, key, value) -> None:
    if a.scalar:
        raise Unsupported("non-torch library call", "item assignment on a numpy scalar")
    _check_writeable(a)
    tracer.builder.call("call_function", numpy_setitem_, (a.tensor, _graph_args(key),
                                                          _graph_args(value)), {})


def iterate(tracer, a: NdarrayVar) -> list:
    if a.tensor.fake.dim() == 0:
        raise TypeError("iteration over a 0-d array")
    rows = tracer.builder.call("call_method", "unbind", (a.tensor, 0), {})
    return [NdarrayVar(r, scalar=r.fake.dim() == 0) for r in rows]


def python_type(a: NdarrayVar) -> type:
    return numpy_dtype(a.tensor.fake.dtype).type if a.scalar else np.ndarray


def from_numpy(tracer, fn, args, kwargs):
    """``torch.from_numpy`` / ``torch.as_tensor`` / ``torch.tensor`` / ``torch.asarray`` of an
    array: a view of its tensor (a copy for ``torch.tensor``), as eager shares memory."""
    a, rest = args[0], args[1:]
    name = fn.__name__
    if rest or set(kwargs) - {"dtype", "device"} or kwargs.get("device") not in (None, "cpu"):
        raise Unsupported("non-torch library call", f"torch.{name}(ndarray, ...) runs in Python")
    t = a.tensor
    view = tracer.builder.call("call_method", "clone" if name == "tensor" else "view_as", (t, t) if
                               name != "tensor" else (t,), {})
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype is not t.fake.dtype:
        view = tracer.builder.call("call_method", "to", (view, dtype), {})
    return view


_FROM_NUMPY = {torch.from_numpy, torch.as_tensor, torch.tensor, torch.asarray}


def holds_array(value, depth: int = 0) -> bool:
    if type(value) is NdarrayVar:
        return True
    if depth < 4 and isinstance(value, (list, tuple)):
        return any(holds_array(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return any(holds_array(v, depth + 1) for v in value.values())
    return False


def _holds_symbolic(value) -> bool:
    from .values import contains_tensor
    return contains_tensor(value) or holds_array(value)
