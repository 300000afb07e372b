"""The symbolic values that live on the interpreter's stack besides plain Python objects.

Design: capture is partial evaluation. A value whose content is fixed for every call that
passes the guards (ints, strings, modules, functions, config objects) stays a plain Python
object; its guard was recorded where it entered the frame. Only tensors are symbolic: a
``TensorVar`` names an FX node and carries a fake tensor with its metadata. Containers
built during capture are real lists/tuples/dicts that may hold TensorVars.
"""
from __future__ import annotations

import types

from .breaks import Unsupported


class _Null:
    """CPython's NULL stack entry (below/above a callable, or a missing local)."""
    __slots__ = ()

    def __repr__(self):
        return "NULL"


NULL = _Null()


class TensorVar:
    """A tensor inside the graph being captured: an FX node plus its fake example value."""
    __slots__ = ("node", "fake", "__weakref__")

    def __init__(self, node, fake):
        self.node = node
        self.fake = fake

    def __repr__(self):
        return f"TensorVar({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"

    # A TensorVar must never silently turn into a Python value: library code calling bool(),
    # len() or iter() on one reached it outside the interpreter's handlers.
    def __bool__(self):
        raise Unsupported("data-dependent branch", "bool() of a tensor")

    def __index__(self):
        raise Unsupported("data-dependent value", "a tensor used as an index/int")

    __int__ = __float__ = __index__

    def __iter__(self):
        raise Unsupported("tensor in native code", "iterating a tensor outside the interpreter")


class ScalarVar:
    """A Python number computed in the graph from tensor data (``t.item()``, ``float(t)``,
    arithmetic on those): ``node`` yields it when the graph runs; ``example`` is a number of
    its type, for working out the metadata of tensor operations it feeds (scalars.py);
    ``tensor`` is a 0-d tensor holding it, the graph output it leaves the graph as."""
    __slots__ = ("node", "example", "tensor", "__weakref__")

    def __init__(self, node, example, tensor):
        self.node = node
        self.example = example
        self.tensor = tensor

    def __repr__(self):
        return f"ScalarVar({self.node.name}, {type(self.example).__name__})"

    __bool__ = TensorVar.__bool__
    __index__ = __int__ = __float__ = TensorVar.__index__


class NdarrayVar:
    """A numpy array (or numpy scalar, ``scalar``) whose data is ``tensor`` in the graph
    (numpy_values.py); ``source`` is the guard expression of an input array, which a
    returned one is (identity)."""
    __slots__ = ("tensor", "scalar", "source", "readonly", "__weakref__")

    def __init__(self, tensor: TensorVar, scalar: bool = False, source: str | None = None,
                 readonly: bool = False):
        self.tensor = tensor
        self.scalar = scalar
        self.source = source
        self.readonly = readonly   # an input array numpy refuses to write into

    def __repr__(self):
        return f"NdarrayVar({self.tensor!r}{', scalar' if self.scalar else ''})"

    __bool__ = TensorVar.__bool__
    __index__ = __int__ = __float__ = TensorVar.__index__
    __iter__ = TensorVar.__iter__


class _MethodOf:
    """``value.method`` read on a symbolic value, before it is called (``calls.call``
    dispatches on the subclass). Each subclass holds the value in its one slot, named for
    what the value is (``array``, ``tensor``, ``storage``)."""
    __slots__ = ("name",)

    def __init__(self, value, name: str):
        setattr(self, type(self).__slots__[0], value)
        self.name = name


class NdarrayMethod(_MethodOf):
    """``array.method`` before it is called."""
    __slots__ = ("array",)


class TensorMethod(_MethodOf):
    """``tensor.method`` before it is called."""
    __slots__ = ("tensor",)

    def __repr__(self):
        return f"TensorMethod({self.tensor!r}.{self.name})"


class StorageVar:
    """``t.untyped_storage()`` of a tensor argument or attribute (``tensor``): capture knows
    its size in bytes (``nbytes``, guarded); handed to Python it is that tensor's storage."""
    __slots__ = ("tensor", "nbytes")

    def __init__(self, tensor: TensorVar, nbytes: int):
        self.tensor = tensor
        self.nbytes = nbytes


class StorageMethod(_MethodOf):
    """``storage.size`` / ``storage.nbytes`` before it is called."""
    __slots__ = ("storage",)


class GradModeExit:
    """The ``__exit__`` of a grad-mode, autocast or warnings context active in the captured
    code."""
    __slots__ = ("restore", "context")

    def __init__(self, restore, context):
        self.restore = restore   # callable(tracer) that records and applies the restore
        self.context = context   # the CapturedContext it exits


class GeneratorContext:
    """A ``@contextlib.contextmanager`` object made during capture: its generator, run
    step by step by the interpreter (``generator_run.GeneratorRun``)."""
    __slots__ = ("run", "entered")

    def __init__(self, run):
        self.run = run
        self.entered = False


class GeneratorContextExit:
    """The ``__exit__`` of an entered ``GeneratorContext`` (``stdlib.exit_generator_context``)."""
    __slots__ = ("context",)

    def __init__(self, context: GeneratorContext):
        self.context = context


class CapturedIter:
    """An iterator met during capture, materialised so a resume function can be handed
    the items it has not yet produced (a list_iterator cannot be inspected or rebuilt).
    Over a lazy iterator of this capture (map, filter, zip, itertools) it pulls each item
    from ``source`` only when asked, as Python would: a map's function then runs when its
    item is consumed and sees what happened before."""
    __slots__ = ("items", "pos", "source")

    def __init__(self, items: list, source=None):
        self.items = items
        self.pos = 0
        self.source = source

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos >= len(self.items):
            if self.source is None:
                raise StopIteration
            try:
                self.items.append(next(self.source))
            except StopIteration:
                self.source = None
                raise
        self.pos += 1
        return self.items[self.pos - 1]

    def remaining(self) -> list:
        while self.source is not None:
            if len(self.items) > 100_000:
                raise Unsupported("huge or endless iterator", "a huge or endless iterator lives "
                                                              "across the graph break")
            try:
                self.items.append(next(self.source))
            except StopIteration:
                self.source = None
        return self.items[self.pos:]


class LazyIter:
    """``map`` / ``filter`` / ``zip`` built during capture. It is as lazy as Python's: the
    work is done by ``inner`` (Python's own iterator, whose function calls are traced), one
    item per ``next``. The parts are kept so the iterator can leave the capture (returned,
    or alive at a graph break) as a real ``kind`` over the items its sources have left:
    what is not consumed yet is computed later, in Python, as eager would."""
    __slots__ = ("kind", "fn", "sources", "kwargs", "inner")

    def __init__(self, kind: type, fn, sources: list, kwargs: dict, inner):
        self.kind = kind
        self.fn = fn
        self.sources = sources
        self.kwargs = kwargs
        self.inner = inner

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.inner)


def has_pending_calls(it, *, lazy_builtins: bool = True) -> bool:
    """Would taking the rest of iterator ``it`` run the program's Python code (a
    generator's body, a function given to an itertools tool; with ``lazy_builtins`` a
    ``map``'s or ``filter``'s function too)?"""
    if type(it) is CapturedIter:
        return it.source is not None and has_pending_calls(it.source, lazy_builtins=lazy_builtins)
    if type(it) is LazyIter:
        if it.kind in (map, filter):
            return lazy_builtins
        return it.kind is not zip or any(has_pending_calls(s, lazy_builtins=lazy_builtins)
                                         for s in it.sources)
    return getattr(type(it), "runs_code", False) is True


def bound_self(value):
    """``value.__self__`` of a bound method (C or Python), else None; never runs a user's
    ``__getattr__`` (``getattr(obj, "__self__", None)`` does, and it may raise KeyError)."""
    if isinstance(value, (types.BuiltinMethodType, types.MethodType, types.MethodWrapperType)):
        return value.__self__
    return None


def check_own_iterator(tracer, it, what: str):
    """Advancing an iterator that lives outside the call (itertools.count(), a data
    iterator) changes it: that happens in Python on every call, never once at capture."""
    if type(it) is not CapturedIter and not tracer.is_internal(it):
        raise Unsupported("impure call", f"{what} advances a {type(it).__name__} that lives "
                          "outside the compiled call")


def python_setattr(obj):
    """``type(obj).__setattr__`` where it is Python code (a config's key aliasing,
    ``Module.__setattr__``), else None."""
    hook = getattr(type(obj), "__setattr__", None)
    return hook if isinstance(hook, types.FunctionType) else None


def python_getattribute(obj):
    """``type(obj).__getattribute__`` where it is Python code, else None."""
    hook = getattr(type(obj), "__getattribute__", None)
    return hook if isinstance(hook, types.FunctionType) else None


def python_descriptor_setter(obj, name: str):
    """The Python code ``obj.name = value`` runs through a data descriptor of its class
    (``property`` with a setter, an object with ``__set__``), as a callable of
    ``(obj, value)``; None where the write is a plain store (no descriptor, or C code such
    as ``__slots__``)."""
    if isinstance(obj, type):
        return None
    for klass in type(obj).__mro__:
        if name in klass.__dict__:
            desc = klass.__dict__[name]
            break
    else:
        return None
    if isinstance(desc, property):
        return desc.fset if isinstance(desc.fset, types.FunctionType) else None
    set_fn = getattr(type(desc), "__set__", None)
    if isinstance(set_fn, types.FunctionType):
        return types.MethodType(set_fn, desc)
    return None


class SuperProxy:
    """``super()`` / ``super(T, obj)`` seen during capture."""
    __slots__ = ("cls", "obj")

    def __init__(self, cls, obj):
        self.cls = cls
        self.obj = obj


def contains_tensor(value, _depth=0) -> bool:
    """True if a TensorVar is anywhere inside ``value`` (tuples, lists, dicts, slices)."""
    if isinstance(value, (TensorVar, NdarrayVar, ScalarVar)):
        return True
    if _depth > 6:
        return False
    if isinstance(value, (list, tuple)):
        return any(contains_tensor(v, _depth + 1) for v in value)
    if isinstance(value, dict):
        return any(contains_tensor(v, _depth + 1) for v in value.values())
    if isinstance(value, slice):
        return any(contains_tensor(v, _depth + 1) for v in (value.start, value.stop, value.step))
    return False
