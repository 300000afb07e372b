"""One capture: the state shared by every frame of it (graph, guards, objects made inside).

The interpreter (``interpreter.py``) runs frames; this module answers the questions frames
ask: what is this value loaded from outside (and what must be guarded about it), what is
``obj.attr``, and what does calling this callable do (record a graph op, inline Python
code, or evaluate a pure function on constants).
"""
from __future__ import annotations

import builtins
import collections
import dataclasses
import enum
import functools
import inspect
import linecache
import sys
import types

import torch

from . import calls, calls_builtins, calls_inline, numpy_values
from .breaks import Unsupported
from .frame_exits import _PyException
from .graph import GraphBuilder
from .guards import is_constant_type
from .selections import Selections
from .side_effects import SideEffects, DELETED, MISSING, is_data_descriptor
from .values import CapturedIter, NdarrayVar, StorageVar, TensorVar, TensorMethod, bound_self, \
    python_getattribute

# Tensor attributes read from the fake tensor's metadata (static under static shapes).
TENSOR_METADATA_ATTRS = {
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "is_sparse",
    "is_quantized", "is_mkldnn", "is_nested", "layout", "is_leaf", "requires_grad",
    "is_mps", "is_xpu",
}
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


class Tracer:
    def __init__(self, builder: GraphBuilder, *, fullgraph: bool = False, dynamic=None,
                 symbolic_ints=frozenset()):
        self.builder = builder
        # Which input dims are symbolic: True (all), or {expression: dims}; plus any dims the
        # user marked with tempa.mark_dynamic.
        self.dynamic = dynamic
        # The expressions whose Python ints are symbols (their value changed between calls;
        # True: every int read from the arguments, under dynamic=True), and every Python int
        # read from outside, by expression (what the next recompile compares,
        # context.CompileContext._symbolic_ints)
        self.symbolic_ints = symbolic_ints
        self.input_ints: dict[str, int] = {}
        self.guards = builder.guards
        self.fullgraph = fullgraph
        self._internal: dict[int, object] = {}      # objects created during capture
        # Our copies of the caller's lists/dicts: id(copy) -> (copy, expression of the original)
        self.external_copies: dict[int, tuple] = {}
        self._contents_guarded: set[int] = set()   # ids of containers read whole by C code
        # The caller's containers read as themselves (subclasses, and the containers in
        # them), handed on as themselves: id -> (object, expression)
        self.outside_containers: dict[int, tuple] = {}
        self._copy_of: dict[int, tuple] = {}   # id(original) -> (original, copy, expression)
        self.param_ids: set[int] = set()
        self.depth = 0
        self.instructions_run = 0
        self.side_effects = SideEffects()   # writes to outside objects, replayed after the graph
        self.paths: dict[int, str] = {}   # id(module) -> "self.h.0.attn", for readable names
        self.ndarrays: dict[int, tuple] = {}   # id(outside ndarray) -> (it, its NdarrayVar)
        # Objects made at capture by a library call that eager makes anew on every call
        # (a collections.namedtuple class): id -> (object, fn, args, kwargs), so the entry
        # calls fn again where the object leaves the capture.
        self.recipes: dict[int, tuple] = {}
        # The caller's plain objects guarded by type at their source, not by identity (a KV
        # cache made anew by every generate()): id -> (object, expression). Their reads go
        # through that expression; a use that depends on which object it is pins it.
        self.sourced: dict[int, tuple] = {}
        self._pinned: set[int] = set()
        self.current_frame = None   # the frame running an instruction (interpreter.Frame.run)
        self.selections = Selections()   # max()/min() over tensors made torch.where
        builder.graph.where = self.user_stack

    def user_stack(self) -> str:
        """Where the user's code is now: the frames being interpreted, outermost first,
        written as a traceback writes them (a graph node's ``stack_trace``)."""
        frames, frame = [], self.current_frame
        while frame is not None:
            frames.append(frame)
            frame = frame.parent
        lines = []
        for frame in reversed(frames):
            code = frame.code
            lineno = getattr(frame.current, "lineno", None) or code.co_firstlineno
            lines.append(f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n')
            text = linecache.getline(code.co_filename, lineno).strip()
            if text:
                lines.append(f"    {text}\n")
        return "".join(lines)

    # -- internal objects -------------------------------------------------------------
    def mark_internal(self, obj):
        self._internal[id(obj)] = obj
        return obj

    def is_internal(self, obj) -> bool:
        return self._internal.get(id(obj)) is obj

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
        guards.add("identity", f"{expr}.__class__ is {guards.const(cls, 'T')}",
                   f"{expr} is a {cls.__name__}")
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
        for node in _nodes(seen):   # (the guard below keeps each one the same object)
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

    @staticmethod
    def is_library_globals(g: dict) -> bool:
        """``g`` is the global namespace of a real library module (torch's own code)."""
        mod = sys.modules.get(g.get("__name__") or "")
        return mod is not None and is_library_module(mod) and mod.__dict__ is g

    def dynamic_dims(self, tensor: torch.Tensor, expr: str) -> set:
        if self.builder.sizes is None:
            return set()
        dims = set(getattr(tensor, "_tempa_dynamic_dims", ()))
        if self.dynamic is True:
            dims |= set(range(tensor.dim()))
        elif isinstance(self.dynamic, dict):
            dims |= set(self.dynamic.get(expr, ()))
        dims -= set(getattr(tensor, "_tempa_static_dims", ()))
        # dims remembered from an earlier call of another rank (a bias (4,) after (3, 4))
        return dims & set(range(tensor.dim()))

    def expr_of(self, obj) -> str:
        """An expression for a fixed object: the object itself, bound as a constant; for
        our copy of a caller's function, the caller's function (its defaults are read there),
        and of a caller's list or tuple subclass, the caller's object."""
        if type(obj) is types.FunctionType:
            copied = self.external_copies.get(id(obj))
            if copied is not None and copied[0] is obj:
                return copied[1]
        copied = self._subclass_copy_source(obj)
        if copied is not None:
            return copied
        sourced = self.sourced.get(id(obj))
        if sourced is not None and sourced[0] is obj:
            return sourced[1]
        return self.guards.const(obj)

    # -- attributes ------------------------------------------------------------------
    def load_attr(self, obj, name: str, frame, *, generic: bool = False):
        """``obj.name`` as the code reads it; ``generic``: ``object.__getattribute__(obj,
        name)``, past the class's own Python ``__getattribute__``."""
        hook = python_getattribute(obj)
        if hook is not None and not generic and not self.is_internal(obj) and \
                self.side_effects.has_writes_to(obj):
            # a Python __getattribute__ (a config's key aliasing) over an object this
            # capture wrote runs traced: the object.__getattribute__ it ends in (a generic
            # read) sees the pending writes, the real one would not
            return self._traced_getattribute(obj, name, frame, hook)
        if self.side_effects:
            written = self.side_effects.pending_attr(obj, name)
            if written is DELETED:
                raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{name}'")
            if written is not MISSING:
                return written
            own = self.side_effects.instance_dict(obj)
            if own is not None and not is_data_descriptor(type(obj), name, read=True):
                if name in own:
                    return own[name]   # obj.__dict__ was read (and maybe written) as our copy
                if name in obj.__dict__:
                    raise Unsupported("mutation of outside state", f"reading {name!r} after "
                                      "deleting it from the object's __dict__")
        if isinstance(obj, TensorVar):
            return self.tensor_attr(obj, name)
        if type(obj) is NdarrayVar:
            return numpy_values.array_attr(self, obj, name)
        if type(obj) is StorageVar:
            return calls.storage_attr(obj, name)
        getter = object.__getattribute__ if generic and hook is not None else getattr
        if self.is_internal(obj) or obj.__class__ in (list, tuple, dict) or \
                id(obj) in self.external_copies or _method_of_copy(self, obj):
            hook = self._class_hook_of_copy(obj, name) if frame is not None else None
            if hook is not None:
                return self._class_getattr_of_copy(obj, name, frame, hook)
            return self._static_or_concrete(obj, name, frame,
                                            guard=self._class_attr_of_copy(obj, name), getter=getter)
        if isinstance(obj, torch.nn.Module):
            return self.module_attr(obj, name, frame)
        if isinstance(obj, types.ModuleType):
            if is_library_module(obj):
                value = getattr(obj, name)
                if isinstance(value, torch.Tensor):
                    return self.external(value, f"{self.expr_of(obj)}.{name}", user=False)
                if not isinstance(value, types.ModuleType) and frame is not None and \
                        not self.is_library_globals(frame.f_globals):
                    # the user's own read of torch.get_device_module (F.gelu, ...): a patch
                    # of it (mock.patch) is then seen. The library's reads inside its own
                    # code are its business, as in eager only a patch the code reads counts.
                    expr = f"{self.expr_of(obj)}.{name}"
                    self.guards.identity(expr, value, expr)
                return value
            return self._guarded_getattr(obj, name, lambda: getattr(obj, name))
        return self._static_or_concrete(obj, name, frame, guard=True, getter=getter)

    def _class_attr_of_copy(self, obj, name: str) -> bool:
        """``obj.name`` on our copy of a caller's list or tuple subclass finds the class's
        method or constant (not one set on the object, which the copy holds at its source,
        nor a descriptor reading the copy, a namedtuple's field): guarded as on the caller's
        object, so a patched ``Seq.total`` is seen."""
        if self._subclass_copy_source(obj) is None or name in getattr(obj, "__dict__", {}) or \
                name.startswith("__") and name.endswith("__"):
            return False
        try:
            static = inspect.getattr_static(type(obj), name)
        except AttributeError:
            return True   # (its absence, guarded)
        return isinstance(static, types.FunctionType) or not hasattr(type(static), "__get__")

    def _class_hook_of_copy(self, obj, name: str):
        """``obj.name`` on our copy of a caller's list or tuple subclass that the class
        answers with code of its own: a descriptor that is no plain function (a classmethod,
        staticmethod, property) or, the name being nowhere on the class, its Python
        ``__getattr__``. Guarded as the class holds it (a patched ``Seq.scale`` or
        ``Seq.__getattr__`` is seen; their values are read from the copy, never in a
        guard). Returns the ``__getattr__`` to run traced, ``False`` for a descriptor (read
        as usual), None where neither applies."""
        if self._subclass_copy_source(obj) is None or name in getattr(obj, "__dict__", {}) or \
                name.startswith("__") and name.endswith("__"):
            return None
        cls, g = type(obj), self.guards
        static = inspect.getattr_static(cls, name, _ABSENT)
        if static is _ABSENT:
            fallback = inspect.getattr_static(cls, "__getattr__", _ABSENT)
            if not isinstance(fallback, types.FunctionType):
                return None
            g.add("module", f"{g.const(class_attribute, 'F')}({g.const(cls, 'T')}, "
                  f"'__getattr__') is {g.const(fallback, 'F')}",
                  f"{cls.__name__}.__getattr__ is the same function")
            g.add("module", f"{g.const(class_attribute, 'F')}({g.const(cls, 'T')}, {name!r}) "
                  f"is {g.const(_ABSENT)}", f"{cls.__name__}.{name} does not exist")
            return fallback
        if isinstance(static, types.FunctionType) or not hasattr(type(static), "__get__"):
            return None
        g.add("module", f"{g.const(class_attribute, 'F')}({g.const(cls, 'T')}, {name!r}) is "
              f"{g.const(static)}", f"{cls.__name__}.{name} is the same {type(static).__name__}")
        return False

    def _class_getattr_of_copy(self, obj, name: str, frame, fallback):
        """``obj.name`` as the class's descriptor or ``__getattr__`` answers it on our copy
        (``_class_hook_of_copy`` guarded which): the ``__getattr__`` runs traced, so what it
        reads is this call's and what it does happens on every call; an AttributeError it
        raises is the read's, which ``getattr(obj, name, default)`` and hasattr catch."""
        if fallback is False:
            return self._static_or_concrete(obj, name, frame, guard=False)
        try:
            return frame.call(fallback, [obj, name], {})
        except _PyException as e:
            raise _as_attribute_error(e) from None

    def _subclass_copy_source(self, obj):
        """The caller's expression our copy ``obj`` of a list or tuple subclass stands for."""
        copied = self.external_copies.get(id(obj))
        if copied is None or copied[0] is not obj or type(obj) in (list, tuple) or \
                not isinstance(obj, (list, tuple)):
            return None
        return copied[1]

    def _traced_getattribute(self, obj, name: str, frame, hook):
        # As Python does, an AttributeError tries __getattr__; one that escapes is raised
        # as a plain AttributeError, which getattr(obj, name, default) and hasattr catch.
        fallback = getattr(type(obj), "__getattr__", None)
        try:
            return frame.call(hook, [obj, name], {})
        except _PyException as e:
            if not (isinstance(e.exc, AttributeError) and isinstance(fallback, types.FunctionType)):
                raise _as_attribute_error(e) from None
        try:
            return frame.call(fallback, [obj, name], {})
        except _PyException as e:
            raise _as_attribute_error(e) from None

    def _guarded_getattr(self, obj, name: str, read, getter=getattr):
        """``read()`` = ``getter(obj, name)`` of an outside object: guarded by value when
        present, by its absence when it raises AttributeError (``getattr(cfg, "x",
        default)``)."""
        o = self.expr_of(obj)
        expr = f"{o}.{name}" if getter is getattr else \
            f"{self.guards.const(getter, 'F')}({o}, {name!r})"
        try:
            value = read()
        except AttributeError:
            has = self.guards.const(hasattr if getter is getattr else has_object_attribute, 'F')
            self.guards.add("constant", f"not {has}({o}, {name!r})", f"{expr} does not exist")
            raise
        # A tensor held by a plain object (a KV cache's layer, an optimizer's state) is
        # data, not a weight: a graph input read through its source on every call and
        # guarded on its metadata, so the object may hold a new tensor on the next call.
        # A module object's tensors (a library's constant) keep their identity guard.
        data = not isinstance(obj, (types.ModuleType, torch.nn.Module, type))
        result = self.external(value, expr, user=data)
        if name == "__dict__" and id(result) in self.external_copies:
            if isinstance(obj, torch.nn.Module):
                self.side_effects.refuse_writes(result)
            else:
                self.side_effects.track_instance_dict(obj, result)
        return result

    def _static_or_concrete(self, obj, name, frame, *, guard: bool, getter=getattr):
        # Properties and Python-level descriptors run their Python code in the interpreter
        # (they may touch tensors); everything else is read directly, by ``getter``
        # (``object.__getattribute__`` for a generic read, past the class's own).
        try:
            static = inspect.getattr_static(obj, name)
        except AttributeError:
            static = None
        if isinstance(static, property) and static.fget is not None and \
                isinstance(static.fget, types.FunctionType):
            return frame.call(static.fget, [obj], {})
        if isinstance(static, types.FunctionType) and not (isinstance(obj, type)):
            inst_dict = getattr(obj, "__dict__", None)
            if not (isinstance(inst_dict, dict) and name in inst_dict):
                if guard:
                    self._guard_class_method(obj, name, static, inst_dict)
                return types.MethodType(static, obj)
        get = getattr(type(static), "__get__", None)
        if isinstance(get, types.FunctionType) and self.side_effects.has_writes_to(obj):
            # a Python descriptor over an object this capture wrote: its code must see the
            # pending writes, so it runs in the interpreter
            return frame.call(get, [static, obj, type(obj)], {})
        if isinstance(static, (classmethod,)) and isinstance(static.__func__, types.FunctionType):
            return types.MethodType(static.__func__, obj if isinstance(obj, type) else type(obj))
        if isinstance(static, staticmethod):
            return static.__func__
        if not guard:
            get = _python_descriptor_get(obj, name, static)
            if get is not None:   # lazy_property and the like: their code runs traced
                return frame.call(get, [static, obj, type(obj)], {})
            return getter(obj, name)  # may raise AttributeError: the frame handles it
        value = getter(obj, name) if inspect.isroutine(static) else None
        if value is not None and getter(obj, name) is not value:
            return value   # a C method, bound afresh on each read: its class decides it
        return self._guarded_getattr(obj, name, lambda: getter(obj, name), getter)

    def _guard_class_method(self, obj, name: str, fn, inst_dict) -> None:
        """``obj.name`` resolved to the class's function ``fn``: guard the class (a
        ``__class__`` swap), the class attribute (a patched method) and that no instance
        attribute shadows it (``obj.name = other``)."""
        g, cls = self.guards, type(obj)
        o, c = self.expr_of(obj), g.const(cls, "T")
        g.add("module", f"{o}.__class__ is {c}", f"{o} is a {cls.__name__}")
        g.add("module", f"{c}.{name} is {g.const(fn, 'F')}", f"{cls.__name__}.{name} is the same function")
        if isinstance(inst_dict, dict):
            # an object guarded by type: its own __dict__, read at its source
            own = f"{o}.__dict__" if id(obj) in self.sourced or id(obj) in self.external_copies \
                else g.const(inst_dict, 'ID')
            g.add("module", f"{name!r} not in {own}", f"{o}.{name} is not overridden on the instance")

    def module_attr(self, mod: torch.nn.Module, name: str, frame):
        """``mod.name`` as ``Module.__getattr__`` finds it, guarded at its source: the entry
        of ``_parameters``/``_buffers``/``_modules`` (bound as constants: a direct write such
        as ``m._modules["fc"] = new`` or ``del m.fc`` is seen, not only ``setattr``)."""
        d = mod.__dict__
        g = self.guards
        for table in ("_parameters", "_buffers", "_modules"):
            entries = d.get(table)
            copied = self._copy_of.get(id(entries)) if entries is not None else None
            if copied is not None and copied[0] is entries:
                # The code read this table as a dict (`m._parameters["w"] = new`, what
                # functional_call does): its writes live in our copy, whose entries were
                # guarded at their sources when it was made, so read it there.
                if name in copied[1]:
                    return copied[1][name]
                if name in entries and name not in d and not hasattr(type(mod), name):
                    # deleted from the table by this call (`del m._buffers["b"]`)
                    raise AttributeError(f"'{type(mod).__name__}' object has no attribute '{name}'")
                continue
            if entries is None or name not in entries:
                continue
            value = entries[name]
            # Sequential/ModuleList deletions replace the whole `_modules` dict: read it
            # through the instance dict each time; `_parameters`/`_buffers` change in place
            src = f"{g.const(d, 'ID')}['_modules'][{name!r}]" if table == "_modules" else \
                f"{g.const(entries, 'MD')}[{name!r}]"
            where = f"{self.path_of(mod)}.{name}"
            if value is None:
                g.add("module", f"{src} is None", f"{where} is None")
                return None
            const = g.const(value, 'P' if table != '_modules' else 'O')
            g.name(const, where)
            g.add("module", f"{src} is {const}", f"{where} is the same {table[1:-1]}")
            if table == "_parameters":
                self.param_ids.add(id(value))
            if table == "_modules":
                self.builder.modules[id(value)] = value
                self.paths.setdefault(id(value), where)
                return value
            return self.builder.attr_input(value, where)
        if name in d:
            value = d[name]
            if isinstance(value, torch.Tensor):
                self.guards.identity(f"{self.expr_of(mod)}.{name}", value)
                return self.builder.attr_input(value, f"{self.path_of(mod)}.{name}")
            return self.external(value, f"{self.expr_of(mod)}.{name}", user=False)
        return self._static_or_concrete(mod, name, frame, guard=True)

    def guard_module_contents(self, mod: torch.nn.Module) -> None:
        """A container module (Sequential, ModuleList, ParameterList, ...) iterated, indexed,
        measured or searched: its children and parameters, in order, are what the code saw
        (``del seq[1]``, ``seq.insert``, ``m._modules[k] = new`` are then seen)."""
        g = self.guards
        d = mod.__dict__
        for table in ("_modules", "_parameters"):
            entries = d.get(table)
            if entries:
                g.add("module", f"tuple({g.const(d, 'ID')}[{table!r}].items()) == "
                      f"{g.const(tuple(entries.items()), 'K')}",
                      f"{self.path_of(mod)} has the same {table[1:]}")

    def tensor_attr(self, t: TensorVar, name: str):
        fake = t.fake
        if name in TENSOR_METADATA_ATTRS:
            if name == "requires_grad" and t.node.op == "placeholder":
                # Reading requires_grad of an input: the graph depends on it.
                pass
            return getattr(fake, name)
        if name == "__class__":   # as type(x) answers (a Parameter's class is Parameter)
            return calls_builtins._tensor_type(self, t)
        if name == "T":
            return self.builder.call("call_method", "permute", (t, *reversed(range(fake.dim()))), {})
        if name == "mT":
            return self.builder.call("call_method", "transpose", (t, -2, -1), {})
        if name == "data":
            return self.builder.call("call_method", "detach", (t,), {})
        if name in ("real", "imag", "H", "mH"):
            return self.builder.call("call_function", getattr, (t, name), {})
        if name == "grad":
            return self._grad_input(t)
        if name in ("grad_fn", "_version", "data_ptr", "_base"):
            if name == "data_ptr":
                raise Unsupported("data-dependent value", f"tensor.{name} needs the real storage")
            raise Unsupported("tensor attribute", f"reading tensor.{name} inside a graph")
        if hasattr(torch.Tensor, name):
            return TensorMethod(t, name)
        return self._tensor_instance_attr(t, name)

    def tensor_key(self, container, key: TensorVar):
        """``key`` used as a key of a dict or set (``d[p]``, ``p in d``, ``d.get(p)``): the
        tensor object it stands for, as eager hashes by identity. A caller's dict (an
        optimizer's ``state``, keyed by the parameters; its keys are guarded by identity in
        ``_external_dict``) holds the real tensors; a dict built during capture may hold the
        TensorVars themselves. A tensor computed in the graph is a new object in eager,
        so it is in no caller's dict."""
        if not isinstance(container, (dict, set, frozenset)):
            raise Unsupported("data-dependent value", "indexing a Python container with a tensor")
        self.selections.note_identity((key,))
        source = self.builder.input_source(key)
        if source is not None and (source[0] in container or id(container) in self.external_copies):
            return source[0]
        if id(container) in self.external_copies:
            return object()   # never a key there
        return key

    def _grad_input(self, t: TensorVar):
        """``p.grad`` of an input tensor (a parameter an optimizer steps, an argument): read
        on every call as an input of its own, its absence (None) or metadata guarded. Each
        backward may leave a new tensor there, so it is read by expression, not bound."""
        source = self.builder.input_source(t)
        if source is None:
            raise Unsupported("tensor attribute", "reading .grad of a tensor computed "
                                                  "inside the graph")
        tensor, expr = source
        grad, grad_expr = tensor.grad, f"{expr}.grad"
        if grad is None:
            self.guards.add("constant", f"{grad_expr} is None", f"{grad_expr} is None")
            return None
        return self.builder.user_input(grad, grad_expr, self.dynamic_dims(grad, grad_expr))

    def _tensor_instance_attr(self, t: TensorVar, name: str):
        """``x.name`` set by the user on an argument tensor (``x.test = None``): read from
        the tensor's ``__dict__``, its presence or absence guarded."""
        real = self.builder.argument_tensor(t)
        attrs = getattr(real, "__dict__", None) if real is not None else None
        if attrs is None:
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        expr = self.builder.argument_expr(t)
        if name not in attrs:
            self.guards.add("constant", f"{name!r} not in {expr}.__dict__", f"{expr}.{name} does not exist")
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        return self.external(attrs[name], f"{expr}.__dict__[{name!r}]", user=False)

    def path_of(self, mod) -> str:
        return self.paths.get(id(mod), type(mod).__name__)

    # -- calls -----------------------------------------------------------------------
    def call(self, frame, fn, args: list, kwargs: dict):
        return calls.call(self, frame, fn, args, kwargs)


class _CapturedDefaultDict(collections.defaultdict):
    """Capture's copy of a caller's defaultdict. Reading a missing key inserts the factory's
    value (``side_effects.defaultdict_missing``, called by the subscript opcode, which has
    the frame to run the factory in); C code reaching ``__missing__`` directly cannot."""

    def __missing__(self, key):
        raise Unsupported("mutation of outside state", "a missing key of a caller's defaultdict "
                          "read outside the interpreter")


def _python_descriptor_get(obj, name: str, static):
    """The Python ``__get__`` that ``obj.name`` runs (a class attribute whose type defines
    it in Python, not shadowed by the instance dict unless it is a data descriptor), or None."""
    if static is None or isinstance(obj, type):
        return None
    get = getattr(type(static), "__get__", None)
    if not isinstance(get, types.FunctionType):
        return None
    is_data = hasattr(type(static), "__set__") or hasattr(type(static), "__delete__")
    inst = getattr(obj, "__dict__", None)
    if not is_data and isinstance(inst, dict) and name in inst:
        return None
    return get


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


def _nodes(seen: _Contents):
    yield seen
    for v in seen[1:]:
        if type(v) is _Contents:
            yield from _nodes(v)


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


def _method_of_copy(tracer, obj) -> bool:
    """``out.append`` of our copy of a caller's list: its attributes (``__self__``) are ours."""
    return type(obj) is _BUILTIN_METHOD and id(getattr(obj, "__self__", None)) in \
        tracer.external_copies


def builtin(name: str):
    return getattr(builtins, name)


def _as_attribute_error(e: _PyException) -> Exception:
    return e.exc if isinstance(e.exc, AttributeError) else e


_ABSENT = object()


def class_attribute(cls: type, name: str):
    """Guard helper: what ``cls`` holds at ``name`` (its own or a base's), without running
    a descriptor; ``_ABSENT`` where it holds nothing."""
    return inspect.getattr_static(cls, name, _ABSENT)


def has_object_attribute(obj, name: str) -> bool:
    """``hasattr`` as ``object.__getattribute__`` answers it (past the class's own)."""
    try:
        object.__getattribute__(obj, name)
    except AttributeError:
        return False
    return True
