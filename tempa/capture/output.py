"""Rebuilding the captured function's return value on every call.

At the end of capture the return value is a Python structure holding TensorVars. It is
turned into (a) the list of graph outputs and (b) a Python expression that rebuilds a fresh
structure of the same shape from those outputs (``___o``) each call: tuples, lists, dicts,
dataclasses and HuggingFace ``ModelOutput`` objects included.

The same expressions hand a graph break's live state (stack values, locals, cells) to the
Python code after the graph. Two rules keep that state as eager would have it:

- An object created during capture (a list, dict, set, cell, function, iterator, instance)
  is rebuilt on every call, never shared across calls: the capture-time object is only a
  template. An object reached from several places (a local and a bound ``out.append`` on
  the stack, a closure's cell and the resume function's cell) is rebuilt once and bound to
  a name (``(___v0 := [...])``) that the later references use, so identity is kept.
- A tensor that is one of the call's own inputs (an argument, a parameter) is that input
  itself, not a graph output: ``return x`` returns ``x``, with its autograd history.
"""
from __future__ import annotations

import collections
import functools
import itertools
import warnings
from collections import OrderedDict

from .breaks import Unsupported
from .guards import GuardSet, is_constant_type
import types

import torch

from . import runtime, selections
from . import numpy_values
from .values import NdarrayMethod, NdarrayVar, ScalarVar, StorageMethod, StorageVar, TensorVar, \
    NULL, TensorMethod, GradModeExit, \
    CapturedIter, LazyIter, GeneratorContext, GeneratorContextExit, bound_self, contains_tensor, \
    has_pending_calls


_BUILTIN_METHOD = type([].append)
_MAX_ITEMS = 100_000   # items an iterator may hand over at a break (an endless one cannot)


def rebuild_object(cls, attrs: dict, items):
    """A new ``cls`` instance with these attributes (and dict items, for dict subclasses),
    without running ``__init__``: the captured run already validated the fields."""
    obj = cls.__new__(cls)
    if isinstance(obj, list):
        list.extend(obj, items)
    elif items is not None:
        # The C-level mapping under the class (OrderedDict keeps its own key order).
        setitem = next(b.__setitem__ for b in cls.__mro__ if b in (OrderedDict, dict))
        for k, v in items:
            setitem(obj, k, v)
    obj.__dict__.update(attrs)
    return obj


def rebuild_tuple(cls, items: tuple, attrs: dict):
    """A ``cls`` (a namedtuple or other tuple subclass) holding ``items``, made as its
    ``__new__`` made it (``tuple.__new__``, without running a user ``__new__`` again), with
    the attributes set on it (``tup.c = ...``)."""
    obj = tuple.__new__(cls, items)
    if attrs:
        obj.__dict__.update(attrs)
    return obj


def rebuild_exception(cls, args: tuple, attrs: dict):
    """An exception built in the compiled code: its ``args`` (what ``str`` shows) and
    attributes."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


def rebuild_lazy(kind: type, fn, sources: list, kwargs: dict):
    """``map(fn, *sources)`` / ``filter(fn, source)`` / ``zip(*sources)`` again."""
    if kind is zip:
        return zip(*sources, **kwargs)
    return kind(fn, *sources, **kwargs)


def rebuild_iterator(cls, items: list):
    """An iterator that yields ``items``, an ``enumerate`` for an enumerate."""
    if cls is enumerate:
        return enumerate([v for _, v in items], items[0][0] if items else 0)
    return iter(items)


def fill_cell(cell, value):
    cell.cell_contents = value
    return cell


def _rebuildable(cls) -> bool:
    """Can ``rebuild_object`` make a ``cls`` without its constructor's arguments?"""
    try:
        rebuild_object(cls, {}, [] if issubclass(cls, list) else None)
    except Exception:
        return False
    return True


def rebuild_function(template, defaults, kwdefaults, closure):
    """A fresh function like ``template`` (made by ``def``/``lambda`` during capture), with
    this call's defaults and cells."""
    fn = types.FunctionType(template.__code__, template.__globals__, template.__name__,
                            defaults, closure)
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = template.__qualname__
    fn.__annotations__ = dict(template.__annotations__)
    fn.__dict__.update(template.__dict__)
    return fn


def input_exprs(builder) -> dict:
    """id(TensorVar) -> the expression of the input tensor it stands for, in the entry."""
    out = {}
    for _, expr, tensor in builder.user_inputs:
        out[id(builder.input_var(tensor))] = expr
    for _, tensor in builder.attr_inputs:
        out[id(builder.input_var(tensor))] = builder.guards.const(tensor, "P")
    return out


def _item_source(value: ScalarVar):
    """The tensor whose ``.item()`` ``value`` is, where that tensor can leave the graph in
    its place (the entry calls ``.item()`` on it, as eager does, and the graph needs no
    ``item``/``scalar_tensor`` nodes): computed in the graph and not written in place after
    the ``.item()``. Else None."""
    node = value.node
    if node.op != "call_method" or node.target != "item" or len(node.args) != 1:
        return None
    source = node.args[0]
    fake = source.meta.get("example_value")
    if not source.op.startswith("call") or fake is None:
        return None
    nodes = list(node.graph.nodes)
    roots = selections.memory_roots(nodes)
    later = nodes[nodes.index(node) + 1:]
    if any(selections.may_write_into(n, roots, roots[source]) for n in later):
        return None
    return TensorVar(source, fake)


class OutputPlan:
    def __init__(self, guards: GuardSet, is_internal, external_copies=None, sizes=None,
                 inputs=None, recipes=None):
        self.guards = guards
        self.recipes = recipes or {}   # id -> (object, fn, args, kwargs): rebuilt as fn(...)
        self.sizes = sizes
        self.is_internal = is_internal
        self.external_copies = external_copies or {}
        self.inputs = inputs or {}   # id(TensorVar) -> expression of that input tensor
        self.outputs: list[TensorVar] = []
        self._slot: dict[int, int] = {}
        self._bound: dict[int, tuple] = {}   # id(object) -> (object, name it is rebuilt as)

    def slot(self, t: TensorVar) -> str:
        given = self.inputs.get(id(t))
        if given is not None:
            return given
        i = self._slot.get(id(t))
        if i is None:
            i = len(self.outputs)
            self._slot[id(t)] = i
            self.outputs.append(t)
        return f"___o[{i}]"

    def _size_expr(self, value) -> str:
        from .shapes import render
        sizes = self.sizes
        expr = sizes.env.replace(value.node.expr)
        names = sizes.names(in_body=True)
        if not expr.free_symbols <= set(names):
            return self._computed(value)
        return render(expr, names)

    def _computed(self, value) -> str:
        """A number only the run knows (``len(unique(x))``, ``len(u) > 3`` on the stack at a
        break): the graph computes it into a 0-d tensor, handed over as its ``.item()``."""
        from .meta import MetaInfo
        dtype = {torch.SymInt: torch.int64, torch.SymFloat: torch.float64,
                 torch.SymBool: torch.bool}[type(value)]
        number = self.sizes.expr_node(value.node.expr)
        node = self.sizes.graph.call_function(torch.scalar_tensor, (number,), {"dtype": dtype})
        node.meta["example_value"] = fake = MetaInfo.of(torch.empty((), dtype=dtype))
        return f"{self.slot(TensorVar(node, fake))}.item()"

    def expr(self, value, depth: int = 0) -> str:
        """A Python expression (over ``___o`` and bound constants) that rebuilds ``value``."""
        if depth > 20:
            raise Unsupported("value leaving compiled code", "return value nested too deeply")
        if isinstance(value, TensorVar):
            return self.slot(value)
        if type(value) is ScalarVar:
            source = _item_source(value)
            if source is not None:   # `return loss.item()`: the tensor leaves, as in eager
                return f"{self.slot(source)}.item()"
            return f"{self.slot(value.tensor)}.item()"   # the number, as the graph computed it
        if type(value) is NdarrayVar and value.source is not None:
            return value.source   # an input array comes back as itself
        if isinstance(value, torch.SymInt):
            return self._size_expr(value)
        if isinstance(value, (torch.SymBool, torch.SymFloat)) and value.node.expr.free_symbols:
            return self._computed(value)
        if value is NULL:
            raise Unsupported("value leaving compiled code", "NULL in the return value")
        copied = self.external_copies.get(id(value))
        if copied is not None and copied[0] is value:
            return copied[1]   # the caller's own list/dict, not our copy of it
        bound = self._bound.get(id(value))
        if bound is not None and bound[0] is value:
            return bound[1]
        method_of = self._method_of_handed_on(value)
        if method_of is not None:
            return method_of
        if type(value) is types.CellType and self.is_internal(value):
            return self._cell(value, depth)
        text, has_identity = self._rebuild(value, depth)
        if not has_identity:
            return text
        name = f"___v{len(self._bound)}"
        self._bound[id(value)] = (value, name)
        return f"({name} := {text})"

    def _rebuild(self, value, depth: int) -> tuple[str, bool]:
        """(an expression that rebuilds ``value``, whether its identity is observable: a
        mutable object made during capture, which later references must share)."""
        const = self.guards.const

        def sub(v):
            return self.expr(v, depth + 1)

        def joined(values):
            return ", ".join(sub(v) for v in values)

        t = type(value)
        owner = bound_self(value)
        if t is _BUILTIN_METHOD and type(owner) in (list, dict, set):
            return f"{sub(owner)}.{value.__name__}", False   # out.append: on this call's `out`
        if t is tuple:
            return (f"({sub(value[0])},)" if len(value) == 1 else f"({joined(value)})"), False
        if t is list:
            return f"[{joined(value)}]", True
        if t is dict:
            return "{" + ", ".join(f"{sub(k)}: {sub(v)}" for k, v in value.items()) + "}", True
        if t is set or t is frozenset and contains_tensor(list(value)):
            return f"{const(t, 'C')}([{joined(value)}])", t is set
        if t is torch.Size and any(isinstance(v, torch.SymInt) for v in value):
            return f"{const(torch.Size, 'C')}([{joined(value)}])", False
        if t.__module__.startswith("torch.return_types"):
            return f"{const(t, 'C')}(({joined(value)},))", False
        if t is slice and contains_tensor(value):   # x[:n] with n computed by the graph
            return (f"{const(slice, 'C')}({sub(value.start)}, {sub(value.stop)}, "
                    f"{sub(value.step)})"), False
        if t is NdarrayVar:   # one real array per call, shared by every reference to it
            return (f"{const(numpy_values.to_numpy, 'F')}({self.slot(value.tensor)}, "
                    f"{value.scalar})"), True
        if t is NdarrayMethod:
            return f"{sub(value.array)}.{value.name}", False
        if t is TensorMethod:
            return f"{self.slot(value.tensor)}.{value.name}", False
        if t is StorageVar:   # a new storage object per call, as in eager
            return f"{self.slot(value.tensor)}.untyped_storage()", False
        if t is StorageMethod:
            return f"{sub(value.storage)}.{value.name}", False
        recipe = self.recipes.get(id(value))
        if recipe is not None and recipe[0] is value:
            _, fn, args, kwargs = recipe
            return f"{const(fn, 'F')}(*{const(args, 'A')}, **{const(kwargs, 'A')})", True
        if isinstance(value, tuple) and t is not torch.Size and (
                self.is_internal(value) or contains_tensor(list(value))):
            # A namedtuple (or tuple subclass) made in the compiled code: its items and the
            # attributes set on it; its class made again when the class is this capture's.
            attrs = "{" + ", ".join(f"{k!r}: {sub(v)}" for k, v in
                                    getattr(value, "__dict__", {}).items()) + "}"
            items = f"({sub(value[0])},)" if len(value) == 1 else f"({joined(value)})"
            return f"{const(rebuild_tuple, 'F')}({sub(t)}, {items}, {attrs})", bool(
                getattr(value, "__dict__", None) is not None)
        if t is CapturedIter:
            if has_pending_calls(value, lazy_builtins=False):
                raise Unsupported("value leaving compiled code",
                                  "a generator (or a lazy tool over "
                                  "one) suspended inside the compiled code leaves it: its "
                                  "code cannot run early, nor be handed to Python")
            return f"{const(iter, 'F')}([{joined(value.remaining())}])", True
        if t is GradModeExit:
            ctx = value.context
            if ctx.kind == "warnings":
                raise Unsupported("context manager", "a graph break inside a "
                                  "warnings.catch_warnings block")
            if ctx.kind == "grad":
                return f"{const(runtime.enter_grad, 'F')}({ctx.target}, {ctx.prev})", True
            a = ctx.autocast
            return (f"{const(runtime.enter_autocast, 'F')}({a.device!r}, "
                    f"{const(a.fast_dtype, 'D')}, {a._enabled}, {a._cache_enabled})"), True
        if t is types.MethodType:
            return (f"{const(runtime.bound_method, 'F')}({sub(value.__func__)}, "
                    f"{sub(value.__self__)})"), False
        if t is functools.partial and self.is_internal(value):
            # A partial made in the compiled code, over this call's values (a resume function
            # handed it guards its func, args and keywords by source).
            return (f"{const(functools.partial, 'C')}({sub(value.func)}, *{sub(value.args)}, "
                    f"**{sub(value.keywords)})"), True
        if t is types.FunctionType and self.is_internal(value):
            # A `def` or lambda run during capture: a new function per call, over this
            # call's cells (the resume function shares them) and defaults.
            if _holds_tensor(value):
                raise Unsupported("value leaving compiled code",
                                  "a function attribute holding a "
                                  "tensor lives across the graph break")
            closure = "None" if value.__closure__ is None else f"({joined(value.__closure__)},)"
            bound = self._bound.get(id(value))
            if bound is not None and bound[0] is value:
                # It closes over itself (`def f(): return f`): building its cell built it.
                return f"({closure}, {bound[1]})[-1]", False
            return (f"{const(rebuild_function, 'F')}({const(value, 'R')}, "
                    f"{sub(value.__defaults__)}, {sub(value.__kwdefaults__)}, {closure})"), True
        if t is LazyIter and value.kind not in (map, filter, zip):
            raise Unsupported("value leaving compiled code",
                              f"a lazy itertools.{value.kind.__name__} "
                              "whose items run Python code leaves the compiled code (taking "
                              "them now would run that code before eager does)")
        if t is LazyIter:
            # Python's own lazy iterator over what its sources have left: items not yet
            # consumed are computed when the caller (or the code after a break) asks. Bound
            # to a name (identity), so a second reference shares the one rebuilt iterator.
            sources = f"[{joined(value.sources)}]"
            return (f"{const(rebuild_lazy, 'F')}({const(value.kind, 'C')}, {sub(value.fn)}, "
                    f"{sources}, {sub(value.kwargs)})"), True
        if t is GeneratorContext or t is GeneratorContextExit:
            raise Unsupported("value leaving compiled code",
                              "a @contextmanager's generator, "
                              "suspended at its yield, lives across the graph break or is "
                              "returned (it cannot be handed to Python)")
        if t is collections.deque and self.is_internal(value):
            return f"{const(t, 'C')}([{joined(value)}], {value.maxlen!r})", True
        if t is collections.defaultdict and self.is_internal(value):
            items = ", ".join(f"{sub(k)}: {sub(v)}" for k, v in value.items())
            return f"{const(t, 'C')}({sub(value.default_factory)}, {{{items}}})", True
        if t in (itertools.count, itertools.repeat) and self.is_internal(value):
            # Endless, so not as items: built again from where it stands (count(5) after
            # two next() from count(3)), through its pickling state (3.11 to 3.13).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)   # 3.12+ deprecates it
                maker, state = value.__reduce__()
            return f"{const(maker, 'C')}(*{sub(state)})", True
        if self.is_internal(value) and (t is enumerate or hasattr(t, "__next__")):
            # An iterator of this capture (enumerate, iter(range)): the items it has left.
            left = list(itertools.islice(value, _MAX_ITEMS + 1))
            if len(left) > _MAX_ITEMS:
                raise Unsupported("huge or endless iterator", f"a huge or endless {t.__name__} "
                                                              "leaves the compiled code")
            return f"{const(rebuild_iterator, 'F')}({const(t, 'C')}, [{joined(left)}])", True
        if hasattr(t, "__next__") and not self._guarded(value):
            raise Unsupported("value leaving compiled code",
                              f"a {t.__name__} iterator created inside "
                              "the compiled function lives across the graph break")
        if is_constant_type(value) or not self.is_internal(value) and not _holds_tensor(value):
            return const(value, "R"), False
        if isinstance(value, BaseException):
            args = "(" + "".join(sub(v) + ", " for v in value.args) + ")"
            attrs = "{" + ", ".join(f"{k!r}: {sub(v)}" for k, v in vars(value).items()) + "}"
            return f"{const(rebuild_exception, 'F')}({const(t, 'C')}, {args}, {attrs})", True
        if hasattr(value, "__dict__") and _rebuildable(t):
            attrs = "{" + ", ".join(f"{k!r}: {sub(v)}" for k, v in vars(value).items()) + "}"
            items = "None"
            if isinstance(value, list):
                items = f"[{joined(value)}]"
            if isinstance(value, dict):
                items = "[" + ", ".join(f"({sub(k)}, {sub(v)})" for k, v in dict.items(value)) + "]"
            return f"{const(rebuild_object, 'F')}({const(t, 'C')}, {attrs}, {items})", True
        raise Unsupported("value leaving compiled code",
                          f"returning a {t.__name__} built inside the "
                          "compiled function")

    def _cell(self, cell, depth: int) -> str:
        """A fresh cell for this call, named before its contents are built: a function
        that closes over itself (``def f(): return f``) refers to the same cell."""
        name = f"___v{len(self._bound)}"
        self._bound[id(cell)] = (cell, name)
        new = f"({name} := {self.guards.const(types.CellType, 'C')}())"
        try:
            contents = cell.cell_contents
        except ValueError:
            return new
        # A tensor in it is this call's (an input, or a graph output). A closure over it that
        # a later capture meets is guarded at its source: handed over as a value, by its
        # code and cells (tracer._external_function); called through tempa after the break,
        # it is a function made per call, with entries of its own (context._made_per_call).
        return f"{self.guards.const(fill_cell, 'F')}({new}, {self.expr(contents, depth + 1)})"

    def _method_of_handed_on(self, value):
        """``buf.write`` of a caller's object that is read at its source (guarded by type,
        not identity): bound again to this call's object, never the one capture saw."""
        owner = getattr(value, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType) or \
                not isinstance(value, (types.MethodType, types.BuiltinMethodType)):
            return None
        source = self.external_copies.get(id(owner))
        if source is None or source[0] is not owner:
            return None
        name = value.__func__.__name__ if isinstance(value, types.MethodType) else value.__name__
        return f"{self.guards.const(getattr, 'F')}({source[1]}, {name!r})"

    def rebuilt(self) -> list:
        """The objects with an identity that the expressions so far rebuild."""
        return [obj for obj, _ in self._bound.values()]

    def _guarded(self, value) -> bool:
        """Is ``value`` an outside object the guards refer to (then it is the same object
        on every call that passes them)?"""
        return any(v is value for v in self.guards.consts.values())


def _holds_tensor(value) -> bool:
    d = getattr(value, "__dict__", None)
    if d and any(isinstance(v, TensorVar) for v in d.values()):
        return True
    if isinstance(value, dict):
        return any(isinstance(v, TensorVar) for v in value.values())
    return False

