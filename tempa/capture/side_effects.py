"""Writes to objects that live outside the compiled call, recorded as data (Dynamo's
``SideEffects``).

Capture never changes an outside object. Each write the code makes to one is recorded
here instead, later reads in the same capture see the written value, and the entry applies
the writes after its graph has run:

- ``obj.name = value`` / ``del obj.name`` on an outside object: recorded per (object,
  name); ``Tracer.load_attr`` answers later reads from the record.
- a caller's list, dict or set: capture already works on a copy of it
  (``Tracer.external_copies``), so later reads see every write; a write marks the copy,
  and the entry puts the copy's final contents back into the caller's object (which keeps
  its identity).
- ``global name`` and ``nonlocal name`` assignment and deletion: recorded per namespace
  and name / per cell; ``LOAD_GLOBAL``/``LOAD_DEREF`` answer from the record.

Replay (``replay_lines``) runs after the graph returned, in three steps, so that no write
changes what another one reads: (1) the caller's state the writes and the return value
read by source (input tensors such as ``d['a']``, the caller's containers) is bound to
names as it was at the call's start; (2) every new value is built, tensors taken from the
graph's outputs; (3) the writes are applied in the order the code first made them. The
final state of each target is what eager leaves. If the graph raises, nothing is written.
The next call's guards then read the state after the writes, as they would after eager.
"""
from __future__ import annotations

import types

import torch

from .breaks import Unsupported
from .values import TensorVar, python_setattr


class _Deleted:
    """The value of a deleted attribute, global or cell."""
    __slots__ = ()

    def __repr__(self):
        return "DELETED"


DELETED = _Deleted()
_RANGE_ITERATOR = type(iter(range(0)))
MISSING = object()   # no pending write


class SideEffects:
    def __init__(self):
        # key -> (kind, target, name, value), in the order of the first write to each target
        # (a later write to the same target keeps that position: dicts keep insertion order).
        self.writes: dict[tuple, tuple] = {}
        self.read_only: dict[int, object] = {}   # id(copy) -> copy that must not be written
        self.instance_dicts: dict[int, tuple] = {}   # id(obj) -> (obj, copy of obj.__dict__)

    def __bool__(self):
        return bool(self.writes)

    # -- recording ----------------------------------------------------------------------
    def store_attr(self, obj, name: str, value) -> None:
        copy = self.instance_dict(obj)
        if copy is not None and not is_data_descriptor(type(obj), name):
            self.store_instance_attr(copy, name, value)
            return
        self.writes[("attr", id(obj), name)] = ("attr", obj, name, value)

    def replaced_buffers(self) -> set:
        """(id(module), name) of each outside module's buffer a write assigns anew."""
        return {(id(obj), name) for kind, obj, name, _ in self.writes.values()
                if kind == "attr" and isinstance(obj, torch.nn.Module) and
                name in obj.__dict__.get("_buffers", {})}

    def store_global(self, namespace: dict, name: str, value) -> None:
        self.writes[("global", id(namespace), name)] = ("global", namespace, name, value)

    def store_cell(self, cell: types.CellType, value) -> None:
        self.writes[("cell", id(cell))] = ("cell", cell, None, value)

    def advance_outside_iterator(self, guards, it):
        """``next(it)`` of a caller's ``range_iterator``: answered by a twin of it that starts
        where ``it`` stands at capture (its position guarded); the entry moves ``it`` to
        where the twin ends. Its position is plain state (``__reduce__`` /
        ``__setstate__``), so the replay is exact. Other outside iterators reached as
        constants (a global list iterator, a data loader's) stay a graph break: their items
        are the caller's objects, not numbers (one handed in as an argument is read by its
        items instead: ``Tracer._external_iterator``)."""
        if type(it) is not _RANGE_ITERATOR or not any(v is it for v in guards.consts.values()):
            raise Unsupported("impure call", f"next() advances a {type(it).__name__} that "
                              "lives outside the compiled call")
        write = self.writes.get(("iter", id(it)))
        if write is None or write[1] is not it:
            # (iter, (range,), index) on 3.11; from 3.12 the range is what is left and the
            # index None
            maker, args, position = it.__reduce__()
            guards.add("constant", f"{guards.const(it)}.__reduce__() == "
                       f"{guards.const((maker, args, position), 'V')}",
                       f"{it!r} starts at item {position or 0} of {args[0]!r}")
            twin = maker(*args)
            if position is not None:
                twin.__setstate__(position)
            write = ("iter", it, 0, twin)
        item = next(write[3])   # StopIteration, as eager raises it, leaves the count as it was
        self.writes[("iter", id(it))] = ("iter", it, write[2] + 1, write[3])
        return item

    def advance_copied_iterator(self, it, copy) -> None:
        """``copy`` (a CapturedIter) iterates the items the caller's list or tuple iterator
        ``it`` has left: the entry moves ``it`` on by as many as the capture took."""
        state = it.__reduce__()   # (iter, (seq,), index); an exhausted one: (iter, ((),))
        start = state[2] if len(state) > 2 else 0
        self.writes[("iter", id(it))] = ("advance", copy, start, None)

    def mutated_copy(self, copy) -> None:
        """``copy`` (our copy of a caller's list/dict/set) was written: write it back."""
        if id(copy) in self.read_only:
            raise Unsupported("mutation of outside state", "writing the __dict__ of an object "
                              "that lives outside the compiled call")
        self.writes.setdefault(("copy", id(copy)), ("copy", copy, None, None))

    def refuse_writes(self, copy) -> None:
        """``copy`` is our copy of an outside module's ``__dict__`` (its attributes live in
        ``_parameters``/``_buffers``/``_modules`` too): a write to it breaks the graph."""
        self.read_only[id(copy)] = copy

    # -- an outside object's __dict__, read as a copy --------------------------------------
    def track_instance_dict(self, obj, copy) -> None:
        """``copy`` is our copy of ``obj.__dict__``: from now on the object's plain attributes
        live in it (``obj.x = v`` writes it, ``obj.x`` reads it), so that ``obj.__dict__[k]``
        and ``obj.k`` agree; it is written back whole. Attribute writes recorded before
        move into it."""
        if self.instance_dicts.get(id(obj), (None, None))[1] is copy:
            return
        self.instance_dicts[id(obj)] = (obj, copy)
        for key, (kind, target, name, value) in list(self.writes.items()):
            if kind == "attr" and target is obj and not is_data_descriptor(type(obj), name):
                del self.writes[key]
                self.store_instance_attr(copy, name, value)

    def has_writes_to(self, obj) -> bool:
        """Has this capture written attributes of ``obj`` (code reading the real object
        would not see them)?"""
        return self.instance_dict(obj) is not None or any(
            kind == "attr" and target is obj for kind, target, _, _ in self.writes.values())

    def instance_dict(self, obj):
        """Our copy of ``obj.__dict__`` if the code read it, else None."""
        entry = self.instance_dicts.get(id(obj))
        return entry[1] if entry is not None and entry[0] is obj else None

    def store_instance_attr(self, copy, name: str, value) -> None:
        self.mutated_copy(copy)
        if value is DELETED:
            dict.pop(copy, name, None)
        else:
            copy[name] = value

    # -- reads that must see pending writes -----------------------------------------------
    def pending_attr(self, obj, name: str):
        return self._pending(("attr", id(obj), name), obj)

    def pending_global(self, namespace: dict, name: str):
        return self._pending(("global", id(namespace), name), namespace)

    def pending_cell(self, cell):
        return self._pending(("cell", id(cell)), cell)

    def _pending(self, key, target):
        write = self.writes.get(key)
        if write is None or write[1] is not target:
            return MISSING
        return write[3]

    # -- replay ---------------------------------------------------------------------------
    def replay_lines(self, plan) -> list[str]:
        """Statements for the entry, after the graph call, that apply the writes."""
        if not self.writes:
            return []
        const = plan.guards.const
        lines = _pin_entry_reads(plan)
        values = []
        for kind, target, name, value in self.writes.values():
            if kind == "copy":
                values.append(_contents_expr(plan, target))
            elif kind == "iter":   # how many items the twin gave
                values.append(repr(name))
            elif kind == "advance":   # where the copy stands now
                values.append(repr(name + target.pos))
            elif value is DELETED:
                values.append(None)
            else:
                values.append(plan.expr(value))
        temps = []
        for i, expr in enumerate(values):
            temps.append(None if expr is None else f"___se{i}")
            if expr is not None:
                lines.append(f"___se{i} = {expr}")
        for (kind, target, name, value), temp in zip(self.writes.values(), temps):
            lines.append(_apply(kind, target, name, temp, plan, const))
        return lines


def _apply(kind, target, name, temp, plan, const) -> str:
    # A deletion is of what existed at the call's start, or of what the code itself made
    # (written, then deleted: nothing to undo), so it is a delete-if-present.
    if kind == "attr" and isinstance(target, TensorVar):   # an input, or a graph output
        obj = plan.expr(target)
        if temp is None:
            return f"{const(delete_attr_if_present, 'F')}({obj}, {name!r})"
        return f"___setattr({obj}, {name!r}, {temp})"
    if kind == "attr":
        copied = plan.external_copies.get(id(target))
        # our copy of a caller's namedtuple/partial/function stands for the caller's object
        obj = copied[1] if copied is not None and copied[0] is target else const(target, "SE")
        if temp is None:
            return f"{const(delete_attr_if_present, 'F')}({obj}, {name!r})"
        # a class's own Python __setattr__ ran at capture (the write is the
        # object.__setattr__ it ended in): replayed as that, not through the hook again
        hooked = python_setattr(target) is not None and not isinstance(target, torch.nn.Module)
        setter = const(object.__setattr__, "F") if hooked else "___setattr"
        return f"{setter}({obj}, {name!r}, {temp})"
    if kind == "global":
        g = const(target, "G")
        return f"{g}.pop({name!r}, None)" if temp is None else f"{g}[{name!r}] = {temp}"
    if kind == "iter":
        return f"{const(advance_range_iterator, 'F')}({const(target, 'SE')}, {temp})"
    if kind == "advance":   # the caller's iterator, read where the capture read it
        return f"{plan.external_copies[id(target)][1]}.__setstate__({temp})"
    if kind == "cell":
        cell = const(target, "CELL")
        if temp is None:
            return f"{const(delete_attr_if_present, 'F')}({cell}, 'cell_contents')"
        return f"{cell}.cell_contents = {temp}"
    # A caller's container: its final contents, into the same object.
    original = plan.external_copies[id(target)][1]
    if type(target) is list:
        return f"{original}[:] = {temp}"
    if isinstance(target, list):   # list's own write: the class's __setitem__ ran at capture
        return f"{const(list.__setitem__, 'F')}({original}, slice(None), {temp})"
    return f"{original}.clear(); {original}.update({temp})"


def is_data_descriptor(cls, name: str, *, read: bool = False) -> bool:
    """``cls.name`` takes precedence over the instance dict (a slot, a property): for a
    write, any ``__set__``; for a read, ``__get__`` and ``__set__`` (one with ``__set__``
    alone leaves reads to the instance dict)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            kind = type(klass.__dict__[name])
            return hasattr(kind, "__set__") and (not read or hasattr(kind, "__get__"))
    return False


def advance_range_iterator(it, count: int) -> None:
    """Move a ``range_iterator`` on by ``count`` items. ``__setstate__`` sets the index on
    3.11 but skips that many items from where it stands on 3.12 and later (whose
    ``__reduce__`` gives the range left and no index)."""
    position = it.__reduce__()[2]
    it.__setstate__(count if position is None else position + count)


def delete_attr_if_present(obj, name: str) -> None:
    try:
        delattr(obj, name)
    except (AttributeError, ValueError):   # ValueError: an empty cell
        pass


def _contents_expr(plan, copy) -> str:
    """The final contents of our copy of a caller's container, as an expression."""
    if any(v is copy for v in (dict.values(copy) if isinstance(copy, dict) else copy)):
        raise Unsupported("mutation of outside state", "a caller's container that holds itself")
    if isinstance(copy, dict):
        return "[" + ", ".join(f"({plan.expr(k)}, {plan.expr(v)})" for k, v in dict.items(copy)) + "]"
    return "[" + ", ".join(plan.expr(v) for v in copy) + "]"


def _pin_entry_reads(plan) -> list[str]:
    """Bind the caller's state read by source (``d['a']``, ``self.cache``) to names at the
    call's start, so that the writes (to ``d``) do not change what the replay and the
    return value read."""
    lines = []
    for key, expr in list(plan.inputs.items()):
        if not expr.isidentifier():
            name = f"___pin{len(lines)}"
            lines.append(f"{name} = {expr}")
            plan.inputs[key] = name
    copies = {}
    for key, (copy, expr) in plan.external_copies.items():
        if not expr.isidentifier():
            name = f"___pin{len(lines)}"
            lines.append(f"{name} = {expr}")
            expr = name
        copies[key] = (copy, expr)
    plan.external_copies = copies
    return lines


def check_outside_attr_write(obj, name: str, value, what: str, *, generic: bool = False) -> None:
    """Refuse the attribute writes on an outside object that a recorded plain store would
    get wrong: a class's or a module object's attributes (read unguarded by other code),
    a custom ``__setattr__``/``__delattr__`` (its code would run at replay, not at the
    write), a plain tensor assigned to a registered parameter (eager raises).
    ``generic``: the write is ``object.__setattr__`` itself (what a Python ``__setattr__``
    ends in, replayed as one: ``_apply``), fine past a Python hook but not past
    ``Module.__setattr__`` (replayed through it) or a C one (eager raises)."""
    if isinstance(obj, (type, types.ModuleType)):
        raise Unsupported("mutation of outside state", f"{what} attribute {name!r} on a "
                          f"{type(obj).__name__} that lives outside the compiled call")
    hook = "__delattr__" if value is DELETED else "__setattr__"
    own = getattr(type(obj), hook, None)
    if generic:
        refused = isinstance(obj, torch.nn.Module) or not (
            own is object.__setattr__ or python_setattr(obj) is not None)
    else:
        refused = own not in (getattr(object, hook), getattr(torch.nn.Module, hook))
    if refused:
        raise Unsupported("mutation of outside state", f"{what} attribute {name!r} on a "
                          f"{type(obj).__name__} with a custom {hook}")
    if isinstance(obj, torch.nn.Module) and isinstance(value, TensorVar) and \
            name in obj.__dict__.get("_parameters", ()):
        raise Unsupported("mutation of outside state", f"assigning a tensor to parameter "
                          f"{name!r} of a {type(obj).__name__}")


def check_tensor_attr_write(tracer, t: TensorVar, name: str, value) -> None:
    """Refuse the writes to a tensor that a recorded plain store would get wrong: a
    property or slot of the tensor class other than ``grad`` (``requires_grad``, ``data``:
    they change the tensor the graph computes with), a tensor subclass's own
    ``__setattr__``, a ``grad`` that eager's setter would refuse (another shape, dtype or
    device: its error would come after the graph instead of at the write)."""
    real = tracer.builder.argument_tensor(t)
    cls = type(real) if real is not None else torch.Tensor
    if cls.__setattr__ is not torch.Tensor.__setattr__:
        raise Unsupported("mutation of outside state", f"setting tensor.{name} on a "
                          f"{cls.__name__} with a custom __setattr__")
    if name == "grad":
        if value is None:
            return
        if not isinstance(value, TensorVar) or _grad_metadata(value) != _grad_metadata(t):
            raise Unsupported("tensor attribute", "setting tensor.grad to a value of "
                              "another type, shape, dtype or device")
        return
    if hasattr(cls, name):
        raise Unsupported("tensor attribute", f"setting tensor.{name} (an attribute of "
                          f"{cls.__name__} itself)")


def _grad_metadata(t: TensorVar) -> tuple:
    fake = t.fake
    return tuple(fake.shape), fake.dtype, fake.device, fake.layout


def defaultdict_missing(frame, copy, key):
    """``d[key]`` of a missing key on our copy of a caller's defaultdict: the factory's value
    is inserted (into the copy, written back after the call) and returned, as eager does."""
    factory = copy.default_factory
    if factory is None:
        raise KeyError(key)
    value = frame.call(factory, [], {})
    dict.__setitem__(copy, key, value)
    frame.tracer.side_effects.mutated_copy(copy)
    return value
