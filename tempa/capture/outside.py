"""What capture reads from outside the captured code: the caller's values wrapped, copied
and guarded (``OutsideValues.external``).

Tensors become graph inputs; constants are guarded by value; the caller's lists, dicts,
sets, container subclasses, partials and nested functions are read as copies guarded item
by item at their sources, so a write at capture reaches the copy, never the caller's
object; the caller's plain objects are guarded by type with each attribute read at its
source; a container capture cannot copy has its contents guarded where it is reached.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import sys
import types

import torch

from . import calls_inline, numpy_values
from .breaks import Unsupported
from .guards import is_constant_type
from .values import CapturedIter, TensorVar, bound_self

_BUILTIN_METHOD = type([].append)
# Library packages whose module objects (only the real ones, found in sys.modules under
# their own name) are not guarded: their attributes are code, not user state. Nothing is
# exempt by name alone (a user's ``remote_cfg`` or ``torch_utils`` is guarded like any object).
_LIBRARY_PACKAGES = frozenset({
    "torch", "math", "cmath", "operator", "builtins", "functools", "itertools", "collections",
    "typing", "transformers", "numpy", "warnings", "logging", "inspect", "dataclasses",
    "contextlib", "enum", "copy", "abc", "types", "re", "einops", "sys"})
# The caller's containers that capture works on a copy of (one copy per object).
_COPIED_TYPES = (list, dict, collections.OrderedDict, collections.defaultdict, set)
# Iterators handed in whose items are guarded one by one (``_external_iterator``); a
# longer one is guarded by identity.
_SEQUENCE_ITERATORS = (type(iter([])), type(iter(())))
_MAX_COPIED_ITEMS = 64
# The most items (nested ones included) guarded one by one in a caller's container that
# capture reads as itself (``_guard_outside_contents``).
_MAX_GUARDED_CONTENTS = 256
# Containers deeper than this are not guarded item by item: capture gives up on the frame
# (it runs eagerly, and says so) instead of recursing towards the interpreter's limit.
_MAX_GUARD_DEPTH = 32


def is_library_module(value) -> bool:
    if not isinstance(value, types.ModuleType):
        return False   # (before reading __name__: a user __getattr__ may raise anything)
    name = getattr(value, "__name__", None)
    return isinstance(name, str) and \
        name.partition(".")[0] in _LIBRARY_PACKAGES and sys.modules.get(name) is value



class OutsideValues:
    """The part of ``tracer.Tracer`` that reads the caller's values (its base class): these
    methods fill the tables ``Tracer.__init__`` makes (``external_copies``, ``_copy_of``,
    ``sourced``, ``_pinned``, ``outside_containers``, ``_contents_guarded``) and read its
    ``guards``, ``builder`` and ``side_effects``."""

    # -- values entering from outside the captured code -----------------------------
    def external(self, value, expr: str, *, user: bool = True, depth: int = 0):
        """Wrap ``value`` read at ``expr`` (an expression valid in the guard function) and
        record what the graph assumes about it."""
        if isinstance(value, torch.Tensor):
            if user:
                return self.builder.user_input(value, expr, self.dynamic_dims(value, expr))
            self.guards.identity(expr, value, expr)
            return self.builder.attr_input(value, expr)
        if type(value) is int:
            self.input_ints[expr] = value
            symbolic = _reached_from_arguments(expr) if self.symbolic_ints is True else \
                expr in self.symbolic_ints
            if symbolic and self.builder.sizes is not None:
                return self.builder.int_input(value, expr)
        if is_constant_type(value) or type(value) is range:
            # (a range is immutable: guarded by value, as a resume function gets a new one
            # on every call)
            self.guards.constant(expr, value)
            return value
        if numpy_values.is_ndarray(value):
            return numpy_values.external_array(self, value, expr)
        if numpy_values.external_dtype_info(self, value, expr):
            return value
        if depth >= _MAX_GUARD_DEPTH and isinstance(value, (list, tuple, dict, set, frozenset)):
            raise Unsupported("deeply nested input", f"{expr[:60]}...: a container nested "
                                                     f"more than {_MAX_GUARD_DEPTH} deep")
        t = type(value)
        guards = self.guards
        copied_subclass = _is_copyable_tuple_subclass(t) or _is_copyable_list_subclass(t)
        if t in _COPIED_TYPES or t in (functools.partial, types.FunctionType) or copied_subclass:
            copied = self._copy_of.get(id(value))
            if copied is not None and copied[0] is value:
                # The same list/dict reached twice (`out` and `out.append.__self__`): one
                # copy, so `is` answers as in eager, and a guard that they stay one object.
                guards.add("length", f"{expr} is {copied[2]}", f"{expr} is {copied[2]}")
                return copied[1]
        if t is tuple or t is list:
            guards.add("length", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"len({expr}) == {len(value)}", f"{expr} is a {t.__name__} of "
                       f"length {len(value)}")
            items = [self.external(v, f"{expr}[{i}]", user=user, depth=depth + 1)
                     for i, v in enumerate(value)]
            if t is tuple:
                return tuple(items)
            self.external_copies[id(items)] = (items, expr)
            self._copy_of[id(value)] = (value, items, expr)
            return items
        if copied_subclass and isinstance(value, list):
            return self._external_list_subclass(value, expr, user, depth)
        if copied_subclass:
            return self._external_tuple_subclass(value, expr, user, depth)
        if t is functools.partial and not value.__dict__:
            return self._external_partial(value, expr, user, depth)
        if t is types.FunctionType and "<locals>" in value.__qualname__ and \
                not value.__dict__ and not calls_inline._is_library_function(value):
            return self._external_function(value, expr)
        if t in (dict, collections.OrderedDict, collections.defaultdict):
            return self._external_dict(value, expr, user, depth)
        if (t is set or t is frozenset) and all(is_constant_type(v) for v in value):
            guards.add("constant", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"{expr} == {guards.const(frozenset(value), 'V')}", f"{expr} == {value!r}")
            copy = set(value) if t is set else value
            if t is set:
                self.external_copies[id(copy)] = (copy, expr)
                self._copy_of[id(value)] = (value, copy, expr)
            return copy
        owner = bound_self(value)
        if t is _BUILTIN_METHOD and type(owner) in (list, dict):
            # `out.append` passed in (a resume function's argument): a new bound method on
            # every call, so guard its list instead, and call it on our copy of that list
            # (where a mutation is a graph break, never a change made once at capture).
            guards.add("constant", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"{expr}.__name__ == {value.__name__!r}", f"{expr} is "
                       f"{type(owner).__name__}.{value.__name__} of {expr}.__self__")
            return getattr(self.external(owner, f"{expr}.__self__", user=user, depth=depth + 1),
                           value.__name__)
        if isinstance(value, torch.nn.Module):
            guards.identity(expr, value, expr)
            self.builder.modules[id(value)] = value
            return value
        if t is types.MethodType:
            # A bound method is a new object on every `obj.method` read (a resume function's
            # `cm.__exit__` argument): its function and its object are what is the same.
            guards.add("identity", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"{expr}.__func__ is {guards.const(value.__func__, 'F')}",
                       f"{expr} is {value.__func__.__qualname__} bound")
            owner = self.external(value.__self__, f"{expr}.__self__", user=user, depth=depth + 1)
            return value if owner is value.__self__ else types.MethodType(value.__func__, owner)
        if is_library_module(value):
            return value
        if user and t in _SEQUENCE_ITERATORS and _reached_from_arguments(expr):
            return self._external_iterator(value, expr, depth)
        if user and (_guarded_by_type(value) or _is_output_record(value)) and \
                _reached_from_arguments(expr) and not guards.is_bound(value):
            return self._external_object(value, expr)   # (not also reached as a constant)
        guards.identity(expr, value, expr)
        self.identity_used(value)   # reached here as a constant, before by its source
        if isinstance(value, (dict, list, set, tuple, collections.deque)):
            # a container capture holds no copy of (a subclass, a set of objects): its
            # writes would reach the caller's object at capture (refused), so its
            # contents are guarded here
            self.outside_containers[id(value)] = (value, expr)
            self._guard_outside_contents(value, expr)
        return value

    def _external_object(self, value, expr: str):
        """A plain Python object of the caller's, reached from the call's arguments (a KV
        cache and its layers, passed to every forward and made anew by every generate()):
        guarded by its class, and each attribute the code reads is guarded at its source
        (``kwargs['cache'].layers[0].keys``, a tensor there an input of the graph), so a new
        object of the same structure finds the same graph. Methods are found through the
        class (guarded), never the object. What depends on which object it is (``is``,
        ``==`` by identity, hashing, ``id()``, C code given it) pins it by identity
        (``identity_used``); the same object reached twice is guarded to stay one."""
        guards = self.guards
        known = self.sourced.get(id(value))
        if known is not None and known[0] is value:
            guards.add("identity", f"{expr} is {known[1]}", f"{expr} is {known[1]}")
            return value
        cls = type(value)
        # (the class methods are found in: type(); ``.__class__`` would run a class's own
        # Python __getattribute__ in the guard, an HF config's two hooks: ~0.8 µs a call)
        own_hook = isinstance(getattr(cls, "__getattribute__", None), types.FunctionType)
        guards.add("identity", f"{'type(' + expr + ')' if own_hook else expr + '.__class__'} is "
                   f"{guards.const(cls, 'T')}", f"{expr} is a {cls.__name__}")
        self.sourced[id(value)] = (value, expr)
        if isinstance(value, dict):
            # An output record: its keys are what iterating it or len() reads; C code that
            # reads its items (ModelOutput's __getitem__ runs dict(self.items())) pins it.
            keys = tuple(dict.keys(value))
            guards.add("length", f"tuple({guards.const(dict.keys, 'F')}({expr})) == "
                       f"{guards.const(keys, 'K')}", f"{expr} has the keys {keys}")
        return value

    def _external_iterator(self, value, expr: str, depth: int):
        """A list's or tuple's iterator handed in (a resume function's loop iterator, a
        comprehension's ``.0`` on 3.11, made anew by the eager part of every call): guarded
        by its class and the items it has left, each at its source, not by identity (which
        recaptured every call). Capture iterates a copy; the entry moves the real iterator
        to where the copy stopped (``side_effects.advance_copied_iterator``), and where the
        copy leaves the capture the real iterator is handed on."""
        guards = self.guards
        rest = iterator_rest(value)
        if len(rest) > _MAX_COPIED_ITEMS:
            guards.identity(expr, value, expr)
            return value
        left = f"{guards.const(iterator_rest, 'F')}({expr})"
        guards.add("length", f"{expr}.__class__ is {guards.const(type(value), 'T')} and "
                   f"len({left}) == {len(rest)}",
                   f"{expr} is a {type(value).__name__} with {len(rest)} items left")
        items = [self.external(v, f"{left}[{i}]", depth=depth + 1) for i, v in enumerate(rest)]
        copy = CapturedIter(items)
        self.external_copies[id(copy)] = (copy, expr)
        self.side_effects.advance_copied_iterator(value, copy)
        return copy

    def identity_used(self, *values) -> None:
        """The capture's result depends on which objects ``values`` are (an ``is``, a dict
        key, ``id()``, C code given them): those guarded by type only are guarded by
        identity from now on."""
        self.selections.note_identity(values)
        for value in values:
            known = self.sourced.get(id(value))
            if known is not None and known[0] is value and id(value) not in self._pinned:
                self._pinned.add(id(value))
                self.guards.identity(known[1], value, known[1])

    def contents_read_by_c(self, obj) -> None:
        """A C method of the caller's output record (a dict guarded by type and so run on
        the real object: ``dict(out.items())``, ``dict.items(out)``) read its items, which
        capture then holds as they were: guard its keys and each item, constants by value
        and other objects (tensors too) by identity, or a later call whose record holds
        another tensor would compute on the first one. (The caller's other container
        subclasses are copied, or their contents guarded where they are reached.)"""
        known = self.sourced.get(id(obj))
        if not isinstance(obj, dict) or known is None or known[0] is not obj or \
                id(obj) in self._contents_guarded:
            return   # objects made by this call, or copies, hold what capture put there
        self._contents_guarded.add(id(obj))
        g, expr = self.guards, known[1]
        keys = tuple(dict.keys(obj))
        g.add("length", f"{g.const(same_keys, 'F')}({expr}, {g.const(keys, 'K')})",
              f"{expr} has the keys {keys}")
        get = g.const(dict.__getitem__, "F")   # not a subclass's own __getitem__
        for k, v in dict.items(obj):
            item = f"{get}({expr}, {g.const(k, 'K')})"
            g.constant(item, v)
            if _is_container(v):
                # handed to the code as the caller's own container (``out["extras"]``), not
                # a copy: what is in it, nested containers too, is guarded, its writes refused
                self._guard_outside_contents(v, item)

    def contents_copied_by_c(self, obj) -> None:
        """``copy.copy(obj)`` of an object of the caller's: C code reads its attributes (and
        an output record's items) into the new object, which capture then holds as they
        were, unguarded (its reads are of an object of this capture). So they are guarded
        as a container read as itself is (``_guard_outside_contents``: by identity or value,
        nested containers too, whose writes are then refused). Our copies of the caller's
        containers hold this call's values already."""
        if self.is_internal(obj) or id(obj) in self.external_copies or is_constant_type(obj) or \
                isinstance(obj, (type, types.ModuleType, TensorVar)):
            return
        if isinstance(obj, dict):
            self.contents_read_by_c(obj)
        attrs = getattr(obj, "__dict__", None)
        if type(attrs) is dict and attrs:
            self._guard_outside_contents(attrs, f"{self.expr_of(obj)}.__dict__")

    def is_outside_container(self, obj) -> bool:
        """``obj`` is the caller's own list, dict or set (a subclass reached by identity, an
        output record), not our copy of one: a write to it at capture would run once, on
        the real object, and leave the guards on its contents behind."""
        known = self.outside_containers.get(id(obj))
        if known is None and isinstance(obj, dict):
            known = self.sourced.get(id(obj))
        return known is not None and known[0] is obj

    def _guard_outside_contents(self, value, expr: str) -> None:
        """The contents of a caller's container subclass that capture does not copy (a list
        or tuple subclass with a hash, slots or its own attribute lookup; a dict or set
        subclass, a registry a library keeps as a global): every read of it (``seq[0]``,
        ``d["k"]``, ``len``, iteration, C methods) reads the real object, and so do reads
        of the containers in it. So its contents, nested containers' too, are guarded as
        they are when it is reached (``same_contents``), and a write to any of them is
        refused (``is_outside_container``): it would run once, on the real object."""
        if isinstance(value, tuple) and not any(map(_is_container, tuple.__iter__(value))):
            return   # (its items stay what they are)
        budget = [_MAX_GUARDED_CONTENTS]
        seen = _contents(value, budget)
        if budget[0] < 0:
            raise Unsupported("unguardable container", f"{expr}: a {type(value).__name__} "
                              f"holding more than {_MAX_GUARDED_CONTENTS} items, nested "
                              "ones included")
        g = self.guards
        for node in container_nodes(seen):   # (the guard below keeps each one the same object)
            self.outside_containers.setdefault(id(node[0]), (node[0], g.const(node[0], "O")))
        g.add("length", f"{g.const(same_contents, 'F')}({expr}, {g.const(seen, 'K')})",
              f"{expr} holds the same {len(seen) - 1} items")

    def guard_distinct_objects(self) -> None:
        """Objects guarded by type that were distinct at capture stay distinct: the writes
        recorded to one are not seen by reads of the other (one guard per class; objects of
        different classes cannot be one)."""
        by_class: dict[type, list[str]] = {}
        for value, expr in self.sourced.values():
            if id(value) not in self._pinned:
                by_class.setdefault(type(value), []).append(expr)
        g = self.guards
        for cls, exprs in by_class.items():
            if len(exprs) > 1:
                ids = ", ".join(f"{g.const(id, 'F')}({e})" for e in exprs)
                g.add("identity", f"len({{{ids}}}) == {len(exprs)}",
                      f"{', '.join(exprs)} are distinct {cls.__name__} objects")

    def _external_dict(self, value: dict, expr: str, user: bool, depth: int) -> dict:
        """A caller's dict (any keys; OrderedDict and defaultdict too): its type and keys in
        order are guarded, each value by its own source; capture works on a copy, so a
        write to it is seen (and breaks the graph) instead of reaching the caller's dict."""
        guards, t = self.guards, type(value)
        keys = tuple(value.keys())
        if all(is_constant_type(k) for k in keys):
            check = f"{expr}.__class__ is {guards.const(t, 'T')} and tuple({expr}) == {guards.const(keys, 'K')}"
        else:
            # Objects as keys (an optimizer's state, keyed by parameters) are the same objects:
            # `==` on tensors would compare values, and raise for more than one element.
            check = (f"{expr}.__class__ is {guards.const(t, 'T')} and "
                     f"{guards.const(same_keys, 'F')}({expr}, {guards.const(keys, 'K')})")
        if not all(type(k) is str for k in keys):
            # 1 == True == 1.0 as keys: the key types are part of what the code saw
            check += f" and tuple(map(type, {expr})) == {guards.const(tuple(map(type, keys)), 'K')}"
        if t is collections.defaultdict:
            check += f" and {expr}.default_factory is {guards.const(value.default_factory)}"
        guards.add("length", check, f"{expr} is a {t.__name__} with keys {keys}")
        items = [(k, self.external(v, f"{expr}[{guards.const(k, 'K')}]" if type(k) is not str
                                   else f"{expr}[{k!r}]", user=user, depth=depth + 1))
                 for k, v in value.items()]
        if t is collections.defaultdict:
            copy = _CapturedDefaultDict(value.default_factory, items)
        else:
            copy = t(items)
        self.external_copies[id(copy)] = (copy, expr)
        self._copy_of[id(value)] = (value, copy, expr)
        return copy

    def _external_list_subclass(self, value: list, expr: str, user: bool, depth: int) -> list:
        """A caller's list subclass (``class Seq(list)``, also one a resume function is
        handed): read as a list is, its class, length and each item at its source (through
        list's own ``__len__``/``__getitem__``, so that no code of the class runs in a
        guard), plus the attributes set on it. Capture works on a copy of the same class:
        C code reading it (``list.copy(seq)``, ``sorted(seq)``, ``seq[0]``) reads this call's
        items, the class's Python methods run traced on it, and a write (``seq.append``)
        reaches the caller's list when the entry writes the copy back after the graph.
        Where the copy leaves the capture the caller's list is handed on."""
        guards, t = self.guards, type(value)
        guards.add("length", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                   f"{guards.const(list.__len__, 'F')}({expr}) == {len(value)}",
                   f"{expr} is a {t.__name__} of length {len(value)}")
        plain = t.__getitem__ is list.__getitem__
        getitem = guards.const(list.__getitem__, "F")
        items = [self.external(v, f"{expr}[{i}]" if plain else f"{getitem}({expr}, {i})",
                               user=user, depth=depth + 1)
                 for i, v in enumerate(list.__iter__(value))]
        copy = list.__new__(t)   # (not the class's __init__: it ran when the caller made it)
        list.extend(copy, items)
        self._copy_instance_attrs(value, copy, expr, user, depth)
        self.external_copies[id(copy)] = (copy, expr)
        self._copy_of[id(value)] = (value, copy, expr)
        return copy

    def _copy_instance_attrs(self, value, copy, expr: str, user: bool, depth: int) -> None:
        """The attributes set on a caller's container subclass (its ``__dict__``), guarded
        by name and each at its source, into our copy of it."""
        attrs = getattr(value, "__dict__", None)
        if attrs is None:
            return
        names = tuple(attrs)
        self.guards.add("length", f"tuple({expr}.__dict__) == {self.guards.const(names, 'K')}",
                        f"{expr} has the attributes {names}")
        copy.__dict__.update({k: self.external(v, f"{expr}.__dict__[{k!r}]", user=user,
                                               depth=depth + 1) for k, v in attrs.items()})

    def _external_tuple_subclass(self, value: tuple, expr: str, user: bool, depth: int):
        """A caller's namedtuple (or other tuple subclass), also one a resume function
        is handed: guarded like a tuple (class, length, each item by its source, read by
        tuple's own methods where the class has its own) plus the attributes set on it,
        never by identity (a new one on every call would recompile every call). Capture
        works on a copy; it stands for the caller's object, which a return or a break hands
        on as itself."""
        guards, t = self.guards, type(value)
        plain = _reads_as_tuple(t)
        length = "len" if plain else guards.const(tuple.__len__, "F")
        guards.add("length", f"{expr}.__class__ is {guards.const(t, 'T')} and {length}({expr}) == "
                   f"{len(value)}", f"{expr} is a {t.__name__} of length {len(value)}")
        getitem = guards.const(tuple.__getitem__, "F")
        items = [self.external(v, f"{expr}[{i}]" if plain else f"{getitem}({expr}, {i})",
                               user=user, depth=depth + 1)
                 for i, v in enumerate(tuple.__iter__(value))]
        copy = t(items) if t.__module__ == "torch.return_types" else tuple.__new__(t, items)
        self._copy_instance_attrs(value, copy, expr, user, depth)
        self.external_copies[id(copy)] = (copy, expr)
        self._copy_of[id(value)] = (value, copy, expr)
        return copy

    def _external_partial(self, value: functools.partial, expr: str, user: bool, depth: int):
        """A caller's ``functools.partial`` (also one a resume function is handed): guarded by
        what calling it uses, its ``func``, ``args`` and ``keywords``, each by its source (a
        tensor argument is an input of the graph), not by identity: a new partial per call
        with the same function would recompile every call. Capture calls a copy standing
        for the caller's partial."""
        guards = self.guards
        guards.add("length", f"{expr}.__class__ is {guards.const(functools.partial, 'T')} and "
                   f"not {expr}.__dict__", f"{expr} is a functools.partial")
        func = self.external(value.func, f"{expr}.func", user=user, depth=depth + 1)
        args = self.external(value.args, f"{expr}.args", user=user, depth=depth + 1)
        keywords = self.external(value.keywords, f"{expr}.keywords", user=user, depth=depth + 1)
        copy = functools.partial(func, *args, **keywords)
        self.external_copies[id(copy)] = (copy, expr)
        self._copy_of[id(value)] = (value, copy, expr)
        return copy

    def _external_function(self, fn: types.FunctionType, expr: str):
        """A caller's nested function (a closure, a lambda, also one a resume function is
        handed): guarded by what calling it runs, its code and globals, not by identity (one
        made anew on every call would recompile every call; a module-level function is one
        object, guarded by identity, which special cases rely on). Capture inlines a copy whose
        cells stand for the caller's: a cell read is guarded at its source
        (``f.__closure__[i].cell_contents``, a tensor there an input of the graph), as
        are the defaults bound (``expr_of`` gives the copy the caller's expression)."""
        g = self.guards
        try:
            contents = [cell.cell_contents for cell in fn.__closure__ or ()]
        except ValueError:   # a cell not assigned yet: the function itself, as any object
            g.identity(expr, fn, expr)
            return fn
        g.add("identity", f"{expr}.__class__ is {g.const(types.FunctionType, 'T')} and "
              f"{expr}.__code__ is {g.const(fn.__code__, 'CODE')} and {expr}.__globals__ is "
              f"{g.const(fn.__globals__, 'G')} and not {expr}.__dict__",
              f"{expr} runs {fn.__qualname__}'s code")
        cells = tuple(types.CellType(value) for value in contents)
        for i, cell in enumerate(cells):
            # read at `{expr}.__closure__[i].cell_contents`; handed on as the caller's cell
            self.external_copies[id(cell)] = (cell, f"{expr}.__closure__[{i}]")
        copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                                  cells or None)
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        self.external_copies[id(copy)] = (copy, expr)
        self._copy_of[id(fn)] = (fn, copy, expr)
        return copy


class _CapturedDefaultDict(collections.defaultdict):
    """Capture's copy of a caller's defaultdict. Reading a missing key inserts the factory's
    value (``side_effects.defaultdict_missing``, called by the subscript opcode, which has
    the frame to run the factory in); C code reaching ``__missing__`` directly cannot."""

    def __missing__(self, key):
        raise Unsupported("mutation of outside state", "a missing key of a caller's defaultdict "
                          "read outside the interpreter")


_HEAPTYPE = 1 << 9   # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def _guarded_by_type(value) -> bool:
    """An instance of a Python class with a plain ``__dict__`` and attribute lookup (no
    module, function, class, enum member or exception, no container subclass, whose items
    C code reads unguarded, nothing of torch's own): what capture reads of it is its
    attributes, each guarded at its source."""
    cls = type(value)
    return bool(cls.__flags__ & _HEAPTYPE) and type(getattr(value, "__dict__", None)) is dict and \
        cls.__getattribute__ is object.__getattribute__ and \
        not isinstance(value, (type, types.ModuleType, types.FunctionType, enum.Enum,
                               BaseException, torch.nn.Module, torch.Tensor,
                               list, tuple, dict, set)) and \
        not (cls.__module__ or "").startswith(("torch", "tempa"))


def _is_output_record(value) -> bool:
    """A dataclass that is also a dict (HuggingFace's ModelOutput: a model's result, made
    anew by every call, which a resume function is handed after a break in the model):
    guarded like a plain object, plus its keys."""
    cls = type(value)
    return isinstance(value, dict) and dataclasses.is_dataclass(cls) and \
        bool(cls.__flags__ & _HEAPTYPE) and type(getattr(value, "__dict__", None)) is dict and \
        cls.__getattribute__ is dict.__getattribute__ and \
        not (cls.__module__ or "").startswith(("torch", "tempa"))


def _reached_from_arguments(expr: str) -> bool:
    """``expr`` reads from the call's arguments (``cache.layers[0]``, a resume function's
    ``___stack2``, a comprehension's ``.0`` as ``___dot0``), not from an object bound as a
    constant."""
    return not expr.startswith("___") or expr.startswith(("___stack", "___dot"))


def _is_copyable_tuple_subclass(t: type) -> bool:
    """A tuple subclass whose instances a copy stands for: one whose items are read as a
    tuple's (a namedtuple, ``class P(tuple)``, a ``torch.return_types`` structseq), or a
    class's own that reads them in Python (its ``__getitem__``, run traced on the copy)
    but hashes and compares as a tuple, so no dict finds the caller's object by identity;
    no slots of its own (a copy holds its items and ``__dict__``)."""
    if not issubclass(t, tuple) or t is tuple or t is torch.Size:
        return False
    heap = bool(t.__flags__ & _HEAPTYPE)
    if heap and not _no_own_slots(t, tuple):
        return False
    return _reads_as_tuple(t) or heap and all(
        getattr(t, m) is getattr(tuple, m) for m in ("__hash__", "__eq__", "__getattribute__"))


def _reads_as_tuple(t: type) -> bool:
    """``x[i]``, ``len(x)`` and iteration of a ``t`` run no user code (in a guard too)."""
    return all(getattr(t, m) is getattr(tuple, m) for m in ("__getitem__", "__len__", "__iter__"))


def _is_copyable_list_subclass(t: type) -> bool:
    """A list subclass made by a class statement whose instances a copy stands for: no
    hash (so no dict or set finds it by identity), no slots of its own (a copy holds its
    items and ``__dict__``), attribute lookup as a list's, not one of torch's own."""
    return issubclass(t, list) and t is not list and bool(t.__flags__ & _HEAPTYPE) and \
        t.__hash__ is None and t.__getattribute__ is list.__getattribute__ and \
        not (t.__module__ or "").startswith(("torch", "tempa")) and _no_own_slots(t, list)


def _no_own_slots(t: type, base: type) -> bool:
    """The classes between ``t`` and ``base`` declare no slots but ``__dict__``/``__weakref__``."""
    for cls in t.__mro__[:t.__mro__.index(base)]:
        slots = cls.__dict__.get("__slots__", ())
        names = {slots} if isinstance(slots, str) else set(slots)
        if not names <= {"__dict__", "__weakref__"}:
            return False
    return True


class _Contents(tuple):
    """A container as capture read it: the object, then its items (a dict's keys, then its
    values), each nested container a ``_Contents`` of its own."""


def _items(value) -> tuple:
    """A container's items through its base type's own methods (no code of a subclass)."""
    if isinstance(value, dict):
        return (*dict.keys(value), *dict.values(value))
    for base in (list, tuple, set, frozenset, collections.deque):
        if isinstance(value, base):
            return tuple(base.__iter__(value))
    raise TypeError(type(value).__name__)


def _is_container(v) -> bool:
    return isinstance(v, (list, tuple, dict, set, frozenset, collections.deque)) and \
        not is_constant_type(v)


def _contents(value, budget: list, within=()) -> _Contents:
    """``value``'s ``_Contents``, counting the items against ``budget[0]`` (below 0: too
    many, or a container inside itself)."""
    items = _items(value)
    budget[0] -= len(items)
    if budget[0] < 0 or any(v is value for v in within):
        budget[0] = -1
        return _Contents((value,))
    out = [value]
    for v in items:
        out.append(_contents(v, budget, (*within, value)) if _is_container(v) else v)
    return _Contents(out)


def container_nodes(seen: _Contents):
    yield seen
    for v in seen[1:]:
        if type(v) is _Contents:
            yield from container_nodes(v)


def same_contents(value, seen: _Contents) -> bool:
    """Guard helper: ``value`` is the container ``seen`` was read from and holds the same
    items, nested containers alike; objects by identity, constants by value and type."""
    if value is not seen[0]:
        return False
    items = _items(value)
    if len(items) != len(seen) - 1:
        return False
    for a, b in zip(items, seen[1:]):
        if type(b) is _Contents:
            if not same_contents(a, b):
                return False
        elif not (a is b or is_constant_type(a) and type(a) is type(b) and a == b):
            return False
    return True


def iterator_rest(it) -> list:
    """Guard helper: the items a list or tuple iterator has left, without advancing it."""
    _, args, *position = it.__reduce__()   # (iter, (seq,), index); an exhausted one: (iter, ((),))
    return list(args[0][position[0] if position else len(args[0]):])


def same_keys(d: dict, keys: tuple) -> bool:
    """Guard helper: ``d``'s keys are ``keys`` in order; objects by identity, constants
    (strings, numbers) by value."""
    return len(d) == len(keys) and all(
        a is b or is_constant_type(a) and type(a) is type(b) and a == b for a, b in zip(d, keys))
