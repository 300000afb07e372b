"""Models of Python's builtins (and of torch's "am I compiling" flags) during capture.

``isinstance``, ``len``, ``getattr``, ``iter``, ``sum``, ``sorted``, ``locals``, the builtin
types' constructors (``_builtin_type``) and the rest run here on the values capture holds:
a tensor's type without its data, an iterable opened through the frame (``frame.get_iter``)
so that each item it reads is traced, a callback (``key=``, ``map``'s function) called
through ``frame.call``. ``MODELS`` maps each builtin to its model; ``calls.py`` merges it
into its table of modelled callables. Nothing here imports the dispatcher.
"""
from __future__ import annotations

import builtins
import collections
import functools
import math
import operator
import types

import torch
import torch.optim.optimizer as torch_optimizer

from . import numpy_values, scalar_tensors, scalars, shapes
from .breaks import Unsupported, UserError
from .instructions import PY
from .purity import _check_pure_arguments
from .values import CapturedIter, LazyIter, NdarrayMethod, NdarrayVar, ScalarVar, TensorVar, \
    TensorMethod, SuperProxy, check_own_iterator, contains_tensor

# Values whose content is only known when the graph runs: never turned into Python values.
_SYMBOLIC = (TensorVar, NdarrayVar, ScalarVar)


def _tensor_type(tracer, t: TensorVar):
    return torch.nn.Parameter if t.node.op == "placeholder" and _is_param(tracer, t) else torch.Tensor


def _is_param(tracer, t):
    return any(node is t.node and isinstance(obj, torch.nn.Parameter)
               for node, obj in tracer.builder.attr_inputs)


# A symbolic number stands for a Python number of this class (an int made a symbol
# because it changed between calls is still an int to the user's code).
_SYMBOLIC_NUMBER_TYPES = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def _isinstance(tracer, frame, args, kwargs):
    if kwargs or len(args) != 2:
        _user_error(isinstance, *[None] * len(args), **kwargs)   # eager's TypeError
    value, cls = args
    if type(value) in _SYMBOLIC_NUMBER_TYPES:
        return issubclass(_SYMBOLIC_NUMBER_TYPES[type(value)], cls)
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
    if len(args) == 1 and type(args[0]) in _SYMBOLIC_NUMBER_TYPES:
        return _SYMBOLIC_NUMBER_TYPES[type(args[0])]
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


def _object_setattr(tracer, frame, args, kwargs):
    obj, name, value = args
    if isinstance(obj, _SYMBOLIC):
        # a tensor's __setattr__ is object's; a subclass's own is refused there
        frame.store_attr(obj, name, value)
    else:
        frame.object_store_attr(obj, name, value)
    return None


def _object_getattribute(tracer, frame, args, kwargs):
    obj, name = args
    return tracer.load_attr(obj, name, frame, generic=True)


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
            if len(items) == 1 and not kwargs:
                return items[0]   # nothing to compare: the item itself
            chosen = None if kwargs else tracer.selections.choose(tracer, frame, which, items)
            if chosen is None:
                raise Unsupported("data-dependent branch",
                                  f"{which}() over tensors compares values")
            return chosen
        if not kwargs and len(items) > 1 and _symbolic_ints(items):
            # ``max(n, 0)`` of a symbolic int: sympy's Max (torch.sym_max), one graph for
            # every value; comparing would guard which one is larger (a graph per sign)
            return functools.reduce(torch.sym_max if which == "max" else torch.sym_min, items)
        if "key" in kwargs and isinstance(kwargs["key"], types.FunctionType):
            keys = [frame.call(kwargs["key"], [v], {}) for v in items]
            pairs = list(zip(keys, range(len(items))))
            best = (min if which == "min" else max)(pairs)
            return items[best[1]]
        return (min if which == "min" else max)(items, **kwargs)
    return handler


def _symbolic_ints(items) -> bool:
    """Ints, one of them symbolic at least. Not bools (``max(n, True)`` is True, a bool,
    where n <= 1) nor floats (``max(n, 2.5)`` is an int or a float, by value): there the
    result's type depends on which one wins, so it is chosen by comparing."""
    return all(type(v) in (int, torch.SymInt) for v in items) and \
        any(type(v) is torch.SymInt for v in items)


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


def _builtin_type(tracer, frame, cls, args, kwargs):
    if cls is not type:
        _check_pure_arguments(args, kwargs, f"{cls.__name__}()")
    if cls in (list, tuple, set, frozenset) and args:
        items = list(frame.get_iter(args[0]))
        return cls(items)
    if cls is dict:
        if args and isinstance(args[0], TensorVar):
            raise Unsupported("unsupported call", "dict(tensor)")
        if args:
            tracer.contents_read_by_c(args[0])   # dict(out): an output record's items, read by C
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


MODELS = {
    builtins.isinstance: _isinstance,
    builtins.len: _len,
    builtins.getattr: _getattr,
    builtins.hasattr: _hasattr,
    builtins.setattr: _setattr,
    builtins.delattr: _delattr,
    # what a class's own __setattr__ / __getattribute__ ends in (``super().__setattr__``)
    object.__setattr__: _object_setattr,
    object.__getattribute__: _object_getattribute,
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
for _name in ("is_exporting",):
    if hasattr(torch.compiler, _name):
        MODELS[getattr(torch.compiler, _name)] = _false
