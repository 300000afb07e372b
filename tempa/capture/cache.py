"""Per-code-object caches of compiled entries, the generated entry functions, invalidation.

An entry is ONE generated Python function with the captured function's own signature: it
checks the guards (returning ``MISS`` at the first failure) and then calls the compiled
graph and rebuilds the return value. CPython binds the arguments, so the per-call work is
the guard expressions plus one call.
"""
from __future__ import annotations

import ast
import collections
import inspect
import re
import threading
import types
import weakref
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import get_gradient_edge
from torch.nn.modules import module as _nn_module

from ..sourcefiles import source_file
from .guards import GuardSet, storage_groups
from .outside import container_nodes, same_contents


class _Miss:
    __slots__ = ()

    def __repr__(self):
        return "MISS"


MISS = _Miss()


@dataclass
class Entry:
    fn: object                    # the generated entry function
    why: object                   # same signature; returns the first failing guard's text
    guards: list[tuple[str, str]]
    source: str
    captured: object              # capture.Captured
    compiled: object
    modules: list = field(default_factory=list)


class CodeCache:
    """All entries of one code object within one compile context."""

    def __init__(self, code, name: str):
        self.code = code
        self.name = name
        self.entries: list[Entry] = []   # replaced, never mutated: readers need no lock
        self.lock = threading.RLock()
        self.eager_reason = None         # set once the code runs eagerly for good
        self.captures = 0
        self.warned = False
        self.last_shapes: dict = {}       # expression -> shape of the last capture's inputs
        self.dynamic_inputs: dict = {}    # expression -> dims made symbolic (automatic dynamic)
        self.last_ints: dict = {}         # expression -> a Python int the last capture read
        self.dynamic_ints: set = set()    # expressions whose ints are symbols (automatic dynamic)
        self.static_ints = None           # why symbolic ints failed here (then: by value)
        # (id(module), name) of buffers a capture of this code assigned anew (`self.ema =
        # ...`): later captures read them by source, not by identity
        self.replaced_buffers: set = set()
        self.static_only = None           # why symbolic sizes failed here (then: per shape)
        self.module_call = False          # the code is a module's forward, called as the module

    def add(self, entry: Entry) -> None:
        # Most recent first: a changed input (batch 9 after 8) is likely to repeat.
        self.entries = [entry] + self.entries
        for m in entry.modules:
            _watch(m, self, entry)

    def remove(self, entry: Entry) -> None:
        with self.lock:
            self.entries = [e for e in self.entries if e is not entry]

    def clear(self) -> None:
        with self.lock:
            self.entries = []
            self.eager_reason = None
            self.captures = 0
            self.warned = False
            self.last_shapes = {}
            self.dynamic_inputs = {}
            self.last_ints = {}
            self.dynamic_ints = set()
            self.static_ints = None
            self.replaced_buffers = set()


_NAMED_TWINS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # code -> twin code


def with_identifier_names(fn: types.FunctionType) -> types.FunctionType:
    """``fn`` itself, or, where a local of its code is no Python name (a comprehension's
    or generator expression's iterator argument ``.0``), a twin function whose code names
    that local ``___dot0``: an entry, its guards and a break's resume code are generated
    Python that spell each local by its name. Only names change, not what the bytecode
    does (locals are read by index); the twin shares globals, closure and defaults."""
    code = fn.__code__
    if all(name.isidentifier() for name in code.co_varnames):
        return fn
    twin = _NAMED_TWINS.get(code)
    if twin is None:   # one twin per code object, so its entries are found again next call
        names = tuple(n if n.isidentifier() else "___" + n.replace(".", "dot")
                      for n in code.co_varnames)
        twin = _NAMED_TWINS[code] = code.replace(co_varnames=names)
    renamed = types.FunctionType(twin, fn.__globals__, fn.__name__, fn.__defaults__,
                                 fn.__closure__)
    renamed.__qualname__, renamed.__kwdefaults__ = fn.__qualname__, fn.__kwdefaults__
    return renamed


def signature_source(code, fn) -> str:
    """The parameter list of ``fn`` as source text, defaults filled in afterwards."""
    names = code.co_varnames
    n_pos, n_kwonly = code.co_argcount, code.co_kwonlyargcount
    n_posonly = code.co_posonlyargcount
    parts = list(names[:n_pos])
    if n_posonly:
        parts.insert(n_posonly, "/")
    i = n_pos + n_kwonly
    if code.co_flags & 0x04:   # *args
        parts.append("*" + names[i])
        i += 1
    elif n_kwonly:
        parts.append("*")
    parts.extend(names[n_pos:n_pos + n_kwonly])
    if code.co_flags & 0x08:   # **kwargs
        parts.append("**" + names[i])
    return ", ".join(parts)


def build_entry(fn, captured, compiled, native_checks=None) -> Entry:
    """``native_checks`` (optional): a provider of native checks (``native(spec)``,
    ``checker(specs, fallback)``, ``all_empty()``, ``storage_groups()``; the backend's
    ``nativeguards``): the entry's tensor guards then run in one call, its emptiness guards
    in another, and its storage-sharing guard natively."""
    guards: GuardSet = captured.guards
    ordered = guards.ordered()
    sig = signature_source(fn.__code__, fn)
    call_args = list(captured.user_input_exprs) + [guards.const(t, "P") for t in captured.attr_tensors]
    versioned = _versioned_groups(guards, ordered, native_checks)
    rest = [(e, d) for e, d in ordered if not versioned or e not in versioned.group_of]
    fused = {**_fused_tensor_check(guards, rest, native_checks),
             **_fused_empty_check(guards, rest, native_checks),
             **_native_storage_check(guards, rest, native_checks)}
    # A guard that cannot be evaluated (a shorter list, a missing key, a deleted attribute)
    # is a miss, never the user's exception: the checks run inside one try (free in CPython
    # 3.11+ until something raises); the compiled call runs outside it.
    lines = [f"def ___entry({sig}):", "    try:"]
    if versioned:
        # the guards only dicts' and classes' contents decide, checked only where one of
        # those changed since the guards last held (the first call, or a write since)
        lines.append(f"        ___ch = {versioned.call}")
        lines.append("        if ___ch:")
        for exprs, mask in zip(versioned.members, versioned.masks):
            lines.append(f"            if ___ch & {mask}:")
            lines.extend(f"                if not ({e}): return ___MISS" for e in exprs)
        lines.append(f"            {versioned.seen}[:] = (___ch >> {versioned.mask_bits}).to_bytes(len({versioned.seen}), 'little')")
    for expr, _ in rest:
        expr = fused.get(expr, expr)
        if expr:
            lines.append(f"        if not ({expr}): return ___MISS")
    lines.append("    except Exception:")
    lines.append("        return ___MISS")
    lines.extend(f"    {local} = {expr}" for local, expr in captured.int_locals)
    lines.append(f"    ___o = ___compiled({', '.join(call_args)})")
    lines.extend(f"    {stmt}" for stmt in captured.body)
    source = "\n".join(lines)
    why_lines = [f"def ___why({sig}):"]
    for i, (expr, _) in enumerate(ordered):
        why_lines.append("    try:")
        why_lines.append(f"        if not ({expr}): return ___DESC[{i}]")
        why_lines.append("    except Exception as e:")
        why_lines.append(f"        return f'{{___DESC[{i}]}} (the check raised {{type(e).__name__}})'")
    why_lines.append("    return None")
    ns = dict(guards.consts)
    ns.update(___setattr=setattr, ___MISS=MISS, ___compiled=compiled, ___DESC=[d for _, d in ordered],
              ___ACC=_gradient_accumulators(captured.attr_tensors))
    text = source + "\n\n" + "\n".join(why_lines) + "\n"
    exec(compile(text, source_file(text, f"entry for {fn.__qualname__}"), "exec"), ns)
    entry_fn, why_fn = ns["___entry"], ns["___why"]
    for f in (entry_fn, why_fn):
        f.__defaults__ = fn.__defaults__
        f.__kwdefaults__ = fn.__kwdefaults__
    return Entry(entry_fn, why_fn, ordered, source, captured, compiled, captured.modules)


def _gradient_accumulators(tensors) -> tuple:
    """The gradient accumulators (AccumulateGrad nodes) of the leaf tensors among the
    entry's parameters that require grad, for the entry to hold. Why: autograd keeps a
    leaf's node only while a graph references it, so once the last call's outputs are gone
    every call in grad mode would create a fresh node per parameter (~0.4 µs each, most of
    a small model's autograd cost after the node itself). A live node is eager's own state
    while any earlier output is alive (a training loop's previous loss), and holding it
    extends no lifetime: the entry holds the parameters already. (So a hook registered on
    such a node itself, not on the tensor, stays on it across calls, as in eager while an
    earlier output lives.)"""
    return tuple(get_gradient_edge(t).node for t in tensors
                 if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf)


def _fused_tensor_check(guards: GuardSet, ordered, native_checks) -> dict:
    """The tensor guards that one native call checks: {guard: None}, the first of them
    mapped to that call's source (``___TC(x, ___P3, ...)``, bound in ``guards.consts``)
    instead. Its fallback, for tensors whose fields it cannot read natively, is the same
    Python expressions over its own arguments, so the entry's answer never depends on
    which one ran."""
    if native_checks is None:
        return {}
    fused = [(expr, *guards.tensor_specs[expr]) for expr, _ in ordered
             if expr in guards.tensor_specs and native_checks.native(guards.tensor_specs[expr][1])]
    if not fused:
        return {}
    specs = [spec for _, _, spec in fused]
    params = [f"___t{i}" for i in range(len(specs))]
    body = " and ".join(f"({guards.tensor_expression(p, s)})" for p, s in zip(params, specs))
    ns = dict(guards.consts)
    text = f"def ___tensor_guards({', '.join(params)}):\n    return {body}\n"
    exec(compile(text, source_file(text, "tensor guards"), "exec"), ns)
    check = native_checks.checker(specs, ns["___tensor_guards"])
    if check is None:
        return {}
    call = f"{guards.const(check, 'TC')}({', '.join(value for _, value, _ in fused)})"
    return _first_becomes(call, [expr for expr, _, _ in fused])


def _fused_empty_check(guards: GuardSet, ordered, native_checks) -> dict:
    """The emptiness guards (hook dicts), all in one native ``all_empty(...)`` call at the
    first one's place: {guard: None}, the first mapped to the call."""
    exprs = [expr for expr, _ in ordered if expr in guards.empty_checks]
    all_empty = native_checks.all_empty() if native_checks is not None and exprs else None
    if all_empty is None:
        return {}
    names = [n for expr in exprs for n in guards.empty_checks[expr]]
    return _first_becomes(f"{guards.const(all_empty, 'F')}({', '.join(names)})", exprs)


def _native_storage_check(guards: GuardSet, ordered, native_checks) -> dict:
    """The storage-sharing guard with its tuple computed natively (its Python function is
    the native call's fallback, for tensors it cannot read): {guard: native guard}."""
    exprs = [expr for expr, _ in ordered if expr in guards.storage_checks]
    native = native_checks.storage_groups() if native_checks is not None and exprs else None
    if native is None:
        return {}
    fallback = guards.const(storage_groups, "F")    # the Python function: the guard's own name
    out = {}
    for expr in exprs:
        args, groups = guards.storage_checks[expr]
        out[expr] = f"{guards.const(native, 'F')}({fallback}, {', '.join(args)}) == {groups}"
    return out


# Guards whose answer only some dicts' and classes' contents decide (versioned_roots).
_C = r"___(?:O|ID|MD)\d+"                       # a bound object, instance dict or table
_KEY = r"'(?:[^'\\]|\\.)*'"                     # a string key
_IS = r" is (?:___[A-Za-z]+\d+|None|True|False)"
_DICT_ITEM = re.compile(rf"({_C})\[({_KEY})\](?:\[({_KEY})\])?{_IS}")
_DICT_ABSENT = re.compile(rf"{_KEY} not in ({_C})")
_TYPE_ATTR = re.compile(rf"(___T\d+)\.([A-Za-z_]\w*){_IS}")
_OBJECT_ATTR = re.compile(rf"(___O\d+)\.([A-Za-z_]\w*){_IS}")
_OBJECT_VALUE = re.compile(r"\((___O\d+)\.([A-Za-z_]\w*)\)\.__class__ is (___T\d+) and \1\.\2 == ___V\d+")
_OBJECT_TYPE = re.compile(r"type\((___O\d+)\) is ___T\d+")
_MODULE_TABLE = re.compile(rf"tuple\(({_C})\[({_KEY})\]\.items\(\)\) == ___K\d+")
_SAME_CONTENTS = re.compile(rf"(___F\d+)\(({_C})(?:\[({_KEY})\])?, (___K\d+)\)")
_DICTS = (dict, collections.OrderedDict)
# values compared with ``==`` whose answer an unchanged object decides (no mutable contents)
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), torch.dtype, torch.device)


@dataclass
class _Versioned:
    call: str                       # the versions_changed(...) call, in the entry's names
    seen: str                       # the bytearray of the tags the groups last held at
    group_of: dict                  # guard expression -> its group number
    members: list                   # per group, its guard expressions in order
    masks: list                     # per group, the bits of the roots it reads
    mask_bits: int                  # where the tags start in versions_changed's answer


def _plain_class_attr(cls, attr: str) -> bool:
    """``cls.attr`` is read from the MRO's dicts without running code: the metaclass is
    ``type``, ``type``/``object`` have no data descriptor of that name (``__name__``,
    ``__class__``), and what is found is a plain function or no descriptor at all."""
    if type(cls) is not type or any(hasattr(type(meta.__dict__.get(attr)), "__set__") for meta in (type, object)):
        return False
    try:
        found = inspect.getattr_static(cls, attr)
    except AttributeError:
        return False
    return isinstance(found, types.FunctionType) or not hasattr(type(found), "__get__")


def _instance_attr(obj, attr: str) -> bool:
    """``obj.attr`` is its instance dict's entry, read without running code: the class's
    ``__getattribute__`` is object's, and no data descriptor of the class shadows the entry."""
    cls = type(obj)
    if cls.__getattribute__ is not object.__getattribute__:
        return False
    d = getattr(obj, "__dict__", None)
    if type(d) is not dict or attr not in d:
        return False
    found = inspect.getattr_static(cls, attr, None)
    return not (hasattr(type(found), "__set__") or hasattr(type(found), "__delete__"))


def versioned_roots(guards: GuardSet, expr: str):
    """The ``(object, kind)`` roots whose version tags decide ``expr``'s answer (kinds as
    nativeguards' ``version_of``: ``d`` a dict, ``t`` a class, ``o`` an object's instance
    dict, ``c`` an object's class, ``i`` the dict at a key of a dict, ``g`` the dict at an
    object's attribute), read without running any of the user's code; None for any other
    guard."""
    consts = guards.consts
    if expr in guards.empty_checks:         # hook dicts all empty
        ds = [consts.get(name) for name in guards.empty_checks[expr]]
        return [(d, "d") for d in ds] if ds and all(type(d) in _DICTS for d in ds) else None
    m = _DICT_ITEM.fullmatch(expr)
    if m:
        outer = consts.get(m.group(1))
        if type(outer) not in _DICTS:
            return None
        if m.group(3) is None:
            return [(outer, "d")]
        # the inner dict as found through the outer one at each call: a Sequential's
        # deletion puts a new ``_modules`` dict in its place
        key = ast.literal_eval(m.group(2))
        return [(outer, "d"), ((outer, key), "i")] if type(outer.get(key)) in _DICTS else None
    m = _DICT_ABSENT.fullmatch(expr)
    if m:
        d = consts.get(m.group(1))
        return [(d, "d")] if type(d) in _DICTS else None
    m = _TYPE_ATTR.fullmatch(expr)
    if m:
        cls = consts.get(m.group(1))
        return [(cls, "t")] if _plain_class_attr(cls, m.group(2)) else None
    m = _OBJECT_ATTR.fullmatch(expr) or _OBJECT_VALUE.fullmatch(expr)
    if m and m.re is _OBJECT_VALUE and consts.get(m.group(3)) not in _IMMUTABLE:
        return None
    if m:
        obj = consts.get(m.group(1))
        if type(obj) is types.ModuleType:   # ``torch.nn.functional.relu``: its dict's entry
            d = obj.__dict__
            return [(d, "d")] if m.group(2) in d else None
        return [(obj, "o"), (obj, "c")] if obj is not None and _instance_attr(obj, m.group(2)) else None
    m = _OBJECT_TYPE.fullmatch(expr)
    if m:
        return [(consts.get(m.group(1)), "c")]
    m = _MODULE_TABLE.fullmatch(expr)
    if m:      # a container module's children (compared with ==: modules by identity)
        d, key = consts.get(m.group(1)), ast.literal_eval(m.group(2))
        if type(d) is dict and type(d.get(key)) in _DICTS:
            return [(d, "d"), ((d, key), "i")]
        return None
    m = _SAME_CONTENTS.fullmatch(expr)
    if m and consts.get(m.group(1)) is same_contents:
        return _contents_roots(consts.get(m.group(2)), m.group(3), consts.get(m.group(4)))
    return _source_guard_roots(consts, expr)


# Guards over sources that read through ``object.__getattribute__`` (what a traced Python
# ``__getattribute__`` ends in: an HF config's reads) and the dicts found there.
_GENERIC = rf"___F\d+\(___O\d+, {_KEY}\)"
_SOURCE = rf"(?:{_GENERIC}|{_C})(?:\[(?:{_KEY}|___[VK]\d+)\]){{0,2}}"
_SOURCE_PARTS = re.compile(rf"({_GENERIC}|{_C})((?:\[(?:{_KEY}|___[VK]\d+)\])*)")
_GENERIC_PARTS = re.compile(rf"(___F\d+)\((___O\d+), ({_KEY})\)")
_INDEX = re.compile(rf"\[({_KEY}|___[VK]\d+)\]")
_SOURCE_IS = re.compile(rf"({_SOURCE}) is ({_SOURCE}|___[A-Za-z]+\d+|None|True|False)")
_SOURCE_VALUE = re.compile(rf"\(({_SOURCE})\)\.__class__ is (___T\d+) and \1 == (?:(___[A-Z]+\d+)|0\.0 and "
                           rf"___F\d+\(1\.0, \1\) == -?1\.0)")
_SOURCE_KEYS = re.compile(rf"({_SOURCE})\.__class__ is ___T\d+ and tuple\(\1\) == ___K\d+"
                          rf"(?: and tuple\(map\(type, \1\)\) == ___K\d+)?")
_SOURCE_ABSENT = re.compile(rf"{_KEY} not in ({_SOURCE})")
_NOT_HAS = re.compile(rf"not (___F\d+)\((___O\d+), ({_KEY})\)")


def _source_guard_roots(consts: dict, expr: str):
    """The roots of a guard over sources that read only dicts and instance attributes
    without running code: ``G(obj, 'name')`` (G ``object.__getattribute__``, obj a bound
    object), a bound dict, and up to two subscripts of either, compared by identity, by
    value with an immutable constant, by their keys, or ``'key' not in``; and
    ``not has_object_attribute(obj, 'name')``. None for any other guard."""
    from .tracer import has_object_attribute   # (a cycle at import: tracer -> calls_inline -> cache)
    m = _NOT_HAS.fullmatch(expr)
    if m:
        obj, name, has = consts.get(m.group(2)), ast.literal_eval(m.group(3)), consts.get(m.group(1))
        # hasattr as object.__getattribute__ answers it: so does the builtin hasattr where
        # the class reads attributes that way and has no __getattr__ to fall back on
        plain = has is hasattr and type(obj).__getattribute__ is object.__getattribute__ and \
            _generic_absent(type(obj), "__getattr__", static=True)
        if not (has is has_object_attribute or plain) or not _generic_absent(obj, name):
            return None
        return [(obj, "o"), (obj, "c")]
    m = _SOURCE_IS.fullmatch(expr)
    if m:
        right = m.group(2)
        roots = _source_roots(consts, m.group(1), False)
        if roots is not None and _SOURCE_PARTS.fullmatch(right) and not re.fullmatch(r"___[A-Z]+\d+", right):
            more = _source_roots(consts, right, False)
            return None if more is None else roots + more
        return roots
    m = _SOURCE_VALUE.fullmatch(expr)
    if m:
        immutable = consts.get(m.group(2)) in _IMMUTABLE and \
            (m.group(3) is None or type(consts.get(m.group(3))) in _IMMUTABLE)
        return _source_roots(consts, m.group(1), False) if immutable else None
    m = _SOURCE_KEYS.fullmatch(expr) or _SOURCE_ABSENT.fullmatch(expr)
    if m:
        return _source_roots(consts, m.group(1), True)
    return None


def _source_roots(consts: dict, source: str, contents: bool):
    """The roots that decide which object ``source`` finds (``contents``: and, the object
    being a dict, what it holds), or None where no version tags decide it. A dict found
    inside another is a root of its own: kind ``i`` (a bound dict's item) or ``g`` (an
    object's attribute, read as ``object.__getattribute__`` reads it without running code)."""
    m = _SOURCE_PARTS.fullmatch(source)
    if m is None:
        return None
    base, keys = m.group(1), [_key_value(consts, k) for k in _INDEX.findall(m.group(2))]
    if any(k is _NO_KEY for k in keys):
        return None
    generic = _GENERIC_PARTS.fullmatch(base)
    if generic:
        obj, name = consts.get(generic.group(2)), ast.literal_eval(generic.group(3))
        if consts.get(generic.group(1)) is not object.__getattribute__ or not _generic_plain(obj, name):
            return None
        roots = [(obj, "o"), (obj, "c")]
        if name == "__dict__":         # the instance dict: the "o" root is its own version
            holder, owner = _instance_dict(obj), obj
        else:
            holder = object.__getattribute__(obj, name)
            if keys or contents:
                if type(holder) not in _DICTS or len(keys) > 1:
                    return None        # (a dict inside it has no root that follows it)
                roots.append(((obj, name), "g"))
            owner = None
    else:
        holder, owner = consts.get(base), None
        if type(holder) not in _DICTS:
            return [] if not keys and not contents and base.startswith("___O") else None
        roots = [(holder, "d")]
    if len(keys) > 2 or (keys and type(holder) not in _DICTS):
        return None
    if len(keys) == 2 or (len(keys) == 1 and contents):
        inner = holder.get(keys[0])
        if type(inner) not in _DICTS:
            return None
        # the dict at that key, as found at each call: through the owner's attribute (its
        # instance dict's entry, which nothing shadows while "c" holds) or the bound dict
        roots.append(((owner, keys[0]), "g") if owner is not None else ((holder, keys[0]), "i"))
        if len(keys) == 2 and contents:
            return None
    return roots


_NO_KEY = object()


def _instance_dict(obj):
    """``obj``'s instance dict, read past its class's own ``__getattribute__``; None without one."""
    try:
        return object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None


def _key_value(consts: dict, text: str):
    if text.startswith("___"):
        value = consts.get(text, _NO_KEY)
        return value if type(value) in (int, str) else _NO_KEY
    return ast.literal_eval(text)


def _generic_plain(obj, name: str) -> bool:
    """``object.__getattribute__(obj, name)`` runs no code and what it finds is decided by
    ``obj``'s instance dict and class: no data descriptor of that name on the class (but
    the C ``__dict__`` of a class with instance dicts), and a class attribute found there is
    a plain value (no ``__get__``)."""
    cls, own = type(obj), _instance_dict(obj)
    if type(own) is not dict:
        return False
    try:
        found = inspect.getattr_static(cls, name)
    except AttributeError:
        return name in own
    if name == "__dict__":
        return type(found) is types.GetSetDescriptorType
    kind = type(found)
    if hasattr(kind, "__set__") or hasattr(kind, "__delete__"):
        return False
    return name in own or not hasattr(kind, "__get__")


def _generic_absent(obj, name: str, static: bool = False) -> bool:
    """``has_object_attribute(obj, name)`` is False, decided by ``obj``'s instance dict and
    class: nothing of that name on the class, an instance dict without it. ``static``:
    ``obj`` is a class, and only its own and its bases' dicts are asked."""
    if static:
        try:
            inspect.getattr_static(obj, name)
        except AttributeError:
            return True
        return False
    own = _instance_dict(obj)
    if type(own) is not dict or name in own:
        return False
    try:
        inspect.getattr_static(type(obj), name)
    except AttributeError:
        return True
    return False


def _contents_roots(holder, key, seen):
    """The roots of ``same_contents(holder[key] or holder, seen)``: the holder dict, and
    every dict of the container tree ``seen`` (tuples and frozensets cannot change); None
    where the tree holds a container no version tag covers (a list, a set, a deque)."""
    roots = []
    if key is not None:
        if type(holder) not in _DICTS:
            return None
        roots.append((holder, "d"))
    for node in container_nodes(seen):
        container = node[0]
        if isinstance(container, dict):
            roots.append((container, "d"))
        elif not isinstance(container, (tuple, frozenset)):
            return None
    return roots


def _versioned_groups(guards: GuardSet, ordered, native_checks) -> _Versioned | None:
    """The guards that one native call of ``versions_changed`` lets the entry skip while
    nothing they read changed, grouped by the first dict, class or object each reads
    (module instance dicts, globals and class methods are most of a real model's guards).

    Why sound: a dict's version tag changes on every write to it, a class's when it or a
    base is modified, and no other dict or class ever has a tag once seen; the entry stores
    the tags read *before* it checked the group's guards, and only once they all held, so
    tags that are unchanged mean the same contents as when the guards held. The guards read
    no code of the user's, so running them before the entry's other guards changes nothing
    but the time a miss takes."""
    changed = native_checks.versions_changed() if native_checks is not None else None
    if changed is None:
        return None
    slots: dict = {}                 # (id, kind) -> slot number
    objs, kinds = [], []
    by_first: dict = {}              # first root's slot -> ([exprs], mask)
    for expr, _ in ordered:
        roots = versioned_roots(guards, expr)
        if not roots:
            continue
        bits, first = 0, None
        for obj, kind in roots:
            # a (dict, key) pair is made per guard: the same pair is one root
            key = (id(obj[0]), obj[1], kind) if kind in ("i", "g") else (id(obj), kind)
            if key not in slots:
                slots[key] = len(objs)
                objs.append(obj)
                kinds.append(kind)
            bits |= 1 << slots[key]
            first = slots[key] if first is None else first
        exprs, mask = by_first.get(first, ([], 0))
        by_first[first] = (exprs + [expr], mask | bits)
    groups = list(by_first.values())
    if not groups:
        return None
    seen = guards.const(bytearray(8 * len(objs)), "VS")
    call = (f"{guards.const(changed, 'F')}({guards.const(tuple(objs), 'VR')}, "
            f"{guards.const(''.join(kinds).encode(), 'VK')}, {seen})")
    group_of = {e: i for i, (exprs, _) in enumerate(groups) for e in exprs}
    return _Versioned(call, seen, group_of, [exprs for exprs, _ in groups], [mask for _, mask in groups],
                      64 * ((len(objs) + 63) // 64))


def _first_becomes(call: str, exprs: list) -> dict:
    return {expr: call if i == 0 else None for i, expr in enumerate(exprs)}


# -- invalidation when a module's parameters, buffers or submodules are reassigned ----------
# torch calls these global hooks from register_parameter/register_buffer/add_module and
# from Module.__setattr__, so `model.fc1 = nn.Linear(...)` or `model.w = nn.Parameter(...)`
# drops every entry that read that module, instead of each call guarding every parameter.
# The registry holds only weak references: an entry keeps its graph, guard constants,
# modules and weights alive, and a compiled model the user dropped must free all of them.
# A module's slot goes away with the module (its id may then be reused by a new object).
_watchers: dict[int, list] = {}
# Re-entrant: a garbage collection that runs while _watch holds it (weakref.finalize
# allocates) can run a dead module's finalizer, _forget_module, on the same thread.
_watch_lock = threading.RLock()


def _watch(module, cache: CodeCache, entry: Entry) -> None:
    key = id(module)
    with _watch_lock:
        watchers = _watchers.get(key)
        if watchers is None:
            watchers = _watchers[key] = []
            weakref.finalize(module, _forget_module, key, watchers)
        # entries dropped since (recompiles, a compiled wrapper freed) leave dead references
        watchers[:] = [w for w in watchers if w[1]() is not None]
        watchers.append((weakref.ref(cache), weakref.ref(entry), weakref.ref(module)))


def _forget_module(key: int, watchers: list) -> None:
    with _watch_lock:
        if _watchers.get(key) is watchers:
            del _watchers[key]


def _on_registration(module, name, value):
    # Captured code reaches this through torch's registration hooks (a module built in
    # forward registers its buffers): calls_inline.py models it, never traces it, so no guard
    # reads the registry (its lists change with every entry added).
    # An entry that reads this buffer by source (one assigned anew on every call, the
    # entry's own replayed write included) guards the tensor found there: it stays.
    watchers = _watchers.get(id(module))
    if not watchers:
        return None
    with _watch_lock:
        watchers = _watchers.pop(id(module), [])
        kept, dropped = [], []
        for w in watchers:
            (kept if _reads_by_source(w[1](), module, name) else dropped).append(w)
        if kept:   # the same list: weakref.finalize forgets it with the module
            watchers[:] = kept
            _watchers[id(module)] = watchers
    for cache_ref, entry_ref, mod_ref in dropped:
        cache, entry = cache_ref(), entry_ref()
        if cache is not None and entry is not None and mod_ref() is module:
            cache.remove(entry)
    return None


def _reads_by_source(entry, module, name: str) -> bool:
    return entry is not None and name in module.__dict__.get("_buffers", {}) and \
        (id(module), name) in entry.captured.buffers_by_source


_hooks_installed = False


def install_invalidation_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _nn_module.register_module_parameter_registration_hook(_on_registration)
    _nn_module.register_module_buffer_registration_hook(_on_registration)
    _nn_module.register_module_module_registration_hook(_on_registration)
    _hooks_installed = True


def clear_watchers() -> None:
    with _watch_lock:
        _watchers.clear()
