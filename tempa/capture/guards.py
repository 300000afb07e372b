"""Guards: what a captured graph assumed about its inputs, as one generated Python check.

Each guard is a boolean Python expression over the entry function's arguments (the same
signature as the captured function) and constants bound into the generated function's
namespace. Objects whose identity is itself guarded (modules, functions, config objects) are
referenced directly as constants (``O3.training == False``), so a guard never walks a long
attribute chain at call time (``m.fc1`` through ``Module.__getattr__`` costs ~0.7 µs).
Descriptions, which explain, the report, the logs and recompile warnings show, name those
objects as the user's code does (``self.drop.p == 0.1``): each constant that stands for an
object read from the user's code gets the name of where it was read (``names``), and
``ordered()`` writes descriptions with those names.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

# The order guards run in: cheap, discriminating checks first (research memo §4: a shape
# check first makes a 4-entry cache 2x faster to search). The global modes (grad mode,
# autocast, default dtype) go before everything: one C call each, independent of the
# arguments, and what tells a model's training entry from its no_grad one, so the entry
# that does not apply misses at its first check.
_ORDER = {"mode": 0, "identity": 1, "tensor": 2, "shape": 3, "global": 3, "constant": 4,
          "length": 4, "module": 5}
# A bound constant (``___O13``) or a resume function's stack argument (``___stack2``).
_INTERNAL_NAME = re.compile(r"___[A-Za-z]+\d+")


class GuardSet:
    def __init__(self):
        self._seen: set[str] = set()
        self.guards: list[tuple[int, str, str]] = []   # (order, expression, description)
        self.consts: dict[str, object] = {}
        self._const_by_id: dict[int, str] = {}
        # tensor guard expression -> (the tensor's expression, its TensorSpec)
        self.tensor_specs: dict[str, tuple[str, TensorSpec]] = {}
        # emptiness guard expression -> the constant names it tests
        self.empty_checks: dict[str, list[str]] = {}
        # the storage-sharing guard (at most one): expression -> (its arguments' expressions,
        # the groups it compares with)
        self.storage_checks: dict[str, tuple[list[str], tuple]] = {}
        self.names: dict[str, str] = {}   # "___O13" -> "self.drop": how the user's code says it

    # -- constants --------------------------------------------------------------------
    def const(self, obj, prefix: str = "O") -> str:
        """A name under which ``obj`` is visible to the generated guard/runner code."""
        name = self._const_by_id.get(id(obj))
        if name is None or self.consts.get(name) is not obj:
            name = f"___{prefix}{len(self.consts)}"
            self.consts[name] = obj
            self._const_by_id[id(obj)] = name
        return name

    def is_bound(self, obj) -> bool:
        """Is ``obj`` already a constant of the generated code?"""
        return self.consts.get(self._const_by_id.get(id(obj), "")) is obj

    def name(self, internal: str, readable: str) -> None:
        """``internal`` (a constant's or argument's name) is ``readable`` in the user's code;
        the first name an object is reached by is kept."""
        if internal != readable:
            self.names.setdefault(internal, readable)

    def readable(self, text: str) -> str:
        """``text`` with internal names replaced by the user's (names may refer to names);
        a named expression (``___O8.cell_contents``: a closure variable) goes first."""
        for internal, name in self.names.items():
            if not _INTERNAL_NAME.fullmatch(internal) and internal in text:
                text = text.replace(internal, name)
        for _ in range(4):
            new = _INTERNAL_NAME.sub(lambda m: self.names.get(m.group(0), m.group(0)), text)
            if new == text:
                break
            text = new
        return text

    # -- adding guards ---------------------------------------------------------------
    def mark(self) -> int:
        """Where the guards stand now, for ``forget_since``."""
        return len(self.guards)

    def forget_since(self, mark: int) -> None:
        """Drop the guards added since ``mark`` (reads of a speculative trace that was
        abandoned: the value is read again another way, which guards what it reads)."""
        for _, expr, _ in self.guards[mark:]:
            self._seen.discard(expr)
            for table in (self.tensor_specs, self.empty_checks, self.storage_checks):
                table.pop(expr, None)
        del self.guards[mark:]

    def add(self, kind: str, expr: str, description: str) -> None:
        if expr in self._seen:
            return
        self._seen.add(expr)
        self.guards.append((_ORDER.get(kind, 6), expr, description))

    def identity(self, expr: str, obj, what: str = "") -> None:
        const = self.const(obj)
        self.name(const, what or expr)
        self.add("identity", f"{expr} is {const}", f"{what or expr} is the same object")

    def constant(self, expr: str, value) -> None:
        """``expr`` evaluates to this Python constant (type included: True is not 1; a float
        by value and sign: 0.0 is not -0.0, and NaN is NaN)."""
        if value is None or value is True or value is False or value is Ellipsis:
            self.add("constant", f"{expr} is {value!r}", f"{expr} is {value!r}")
        elif isinstance(value, (torch.dtype, type)) or callable(value):
            self.add("constant", f"{expr} is {self.const(value)}", f"{expr} is {value!r}")
        elif type(value) is float:
            self.add("constant", self._float_check(expr, value), f"{expr} == {value!r}")
        elif isinstance(value, (int, float, str, bytes, torch.device)) or is_numpy_scalar(value):
            t = self.const(type(value), "T")
            self.add("constant", f"({expr}).__class__ is {t} and {expr} == {self.const(value, 'V')}",
                     f"{expr} == {value!r}")
        elif type(value) is range:   # by its three numbers: range(0) == range(2, 2)
            bounds = (value.start, value.stop, value.step)
            self.add("constant", f"({expr}).__class__ is {self.const(range, 'T')} and "
                     f"(({expr}).start, ({expr}).stop, ({expr}).step) == {bounds!r}",
                     f"{expr} == {value!r}")
        elif type(value) is tuple and all(_is_exact_by_equality(v) for v in value):
            self.add("constant", f"{expr} == {self.const(value, 'V')}", f"{expr} == {value!r}")
        elif type(value) is tuple and all(_is_plain_constant(v) for v in value):
            # floats, bools or nested tuples inside: compared item by item, type and sign too
            self.add("length", f"{expr}.__class__ is {self.const(tuple, 'T')} and "
                     f"len({expr}) == {len(value)}", f"{expr} is a tuple of length {len(value)}")
            for i, v in enumerate(value):
                self.constant(f"{expr}[{i}]", v)
        else:
            self.identity(expr, value)

    def _float_check(self, expr: str, value: float) -> str:
        exact = f"({expr}).__class__ is {self.const(float, 'T')} and "
        if value != value:
            return exact + f"{expr} != {expr}"                      # NaN equals nothing
        if value == 0.0:
            sign = math.copysign(1.0, value)
            return exact + f"{expr} == 0.0 and {self.const(math.copysign, 'F')}(1.0, {expr}) == {sign}"
        return exact + f"{expr} == {self.const(value, 'V')}"

    def tensor(self, expr: str, t: torch.Tensor, *, dynamic_dims=(), what: str = "",
               attribute: bool = False) -> None:
        """What the graph assumed about a tensor it reads: type, dtype, device, sizes,
        strides, requires_grad; for an argument also its storage offset, the conjugate and
        negative bits and inference-ness. A parameter or buffer (``attribute``) is the same
        object on every call and its metadata changes only through ``.data =``, ``.to()``,
        ``requires_grad_()`` and in-place resizes: those four items are guarded; the rest
        is not, a measured trade-off (benchmarks/guard_cost.py): kernels read
        ``data_ptr()``, which includes the offset, and a parameter holding a negative-bit or
        inference view is not seen. The check is recorded as a ``TensorSpec`` too, so that
        an entry can run all its tensor checks in one native call (``build_entry``)."""
        if what and expr in self.consts:
            self.name(expr, what)
        spec = TensorSpec.of(t, tuple(dynamic_dims), attribute)
        check = self.tensor_expression(expr, spec)
        self.add("tensor", check, spec.describe(what or expr))
        self.tensor_specs.setdefault(check, (expr, spec))

    def tensor_expression(self, expr: str, spec: "TensorSpec") -> str:
        """The Python check that ``expr`` matches ``spec`` (the entry's definition of it)."""
        parts = [f"{expr}.__class__ is {self.const(spec.type, 'T')}",
                 f"{expr}.dtype is {self.const(spec.dtype, 'D')}"]
        if spec.device.type == "cpu":
            parts.append(f"{expr}.is_cpu")
        else:
            parts.append(f"{expr}.device == {self.const(spec.device, 'DEV')}")
        if spec.dynamic_dims:
            parts.append(f"{expr}.dim() == {len(spec.shape)}")
            for d, n in enumerate(spec.shape):
                if d not in spec.dynamic_dims:
                    parts.append(f"{expr}.shape[{d}] == {n}")
        else:
            parts.append(f"{expr}.shape == {self.const(spec.shape, 'S')}")
        if spec.contiguous:
            # the same sizes and contiguous: the same strides (cheaper than stride())
            parts.append(f"{expr}.is_contiguous()")
        else:
            parts.append(f"{expr}.stride() == {self.const(spec.stride, 'S')}")
        parts.append(f"{expr}.requires_grad is {spec.requires_grad}")
        if not spec.attribute:
            parts.append(f"{expr}.storage_offset() == {spec.offset}")
            # the conjugate bit exists only on complex tensors; the negative bit and
            # inference-ness on any
            if spec.conj is not None:
                parts.append(f"{expr}.is_conj() is {spec.conj}")
            parts.append(f"{expr}.is_neg() is {spec.neg}")
            parts.append(f"{expr}.is_inference() is {spec.inference}")
        return " and ".join(parts)

    def all_empty(self, objects, description: str) -> None:
        """Each of ``objects`` (bound as constants: hook dicts) is empty (falsy)."""
        names = [self.const(o, "H") for o in objects]
        expr = "not (" + " or ".join(names) + ")"
        self.add("module", expr, description)
        self.empty_checks.setdefault(expr, names)

    def shared_storage(self, exprs: list[str], groups: tuple, description: str) -> None:
        """Which of the tensors ``exprs`` share storage is ``groups`` (``storage_groups``)."""
        expr = f"{self.const(storage_groups, 'F')}({', '.join(exprs)}) == {groups}"
        self.add("global", expr, description)
        self.storage_checks.setdefault(expr, (list(exprs), groups))

    def global_state(self, expr: str, value, description: str) -> None:
        self.add("global", f"{expr} is {value!r}", description)

    # -- output ------------------------------------------------------------------------
    def ordered(self) -> list[tuple[str, str]]:
        """(expression, description) in evaluation order, descriptions in the user's names."""
        return [(e, self.readable(d)) for _, e, d in sorted(self.guards, key=lambda g: g[0])]


@dataclass(frozen=True)
class TensorSpec:
    """The metadata a tensor guard checks, as data (no reference to the tensor itself: an
    entry must not keep its example inputs alive). The layout is checked as
    ``is_contiguous()`` where ``contiguous`` (then the sizes imply the strides), else as
    ``stride()``; ``offset``, ``conj``, ``neg`` and ``inference`` are
    checked only when ``attribute`` is false (``conj`` only for complex tensors: None)."""
    type: type
    dtype: torch.dtype
    device: torch.device
    shape: tuple            # sizes at capture; a dim in ``dynamic_dims`` may be any size
    dynamic_dims: tuple
    stride: tuple           # at capture
    contiguous: bool
    requires_grad: bool
    attribute: bool
    offset: int
    conj: bool | None
    neg: bool
    inference: bool

    @staticmethod
    def of(t: torch.Tensor, dynamic_dims: tuple, attribute: bool) -> "TensorSpec":
        contiguous = bool(dynamic_dims) or (t.is_contiguous() and all(n > 1 for n in t.shape))
        return TensorSpec(type(t), t.dtype, t.device, tuple(t.shape), dynamic_dims,
                          tuple(t.stride()), contiguous, t.requires_grad, attribute,
                          t.storage_offset(), t.is_conj() if t.is_complex() else None,
                          t.is_neg(), t.is_inference())

    def describe(self, what: str) -> str:
        shape = tuple("*" if d in self.dynamic_dims else n for d, n in enumerate(self.shape))
        layout = "contiguous" if self.dynamic_dims else f"stride {self.stride}"
        flags = "".join(f", {name}" for name, on in (("conj", self.conj), ("neg", self.neg),
                                                     ("inference", self.inference)) if on)
        return (f"{what} is a {self.type.__name__} {self.dtype} on {self.device} of shape "
                f"{shape}, {layout}, offset {self.offset}, "
                f"requires_grad={self.requires_grad}{flags}")


def storage_groups(*tensors) -> tuple:
    """For each tensor, the index of the first one sharing its storage: (0, 1, 0) says the
    first and third alias. Guarded over a call's tensor arguments, so a graph traced with
    distinct inputs never runs on aliased ones (``f(z, z)`` after ``f(a, b)``)."""
    first: dict = {}
    return tuple(first.setdefault(_storage_key(t), i) for i, t in enumerate(tensors))


def _storage_key(t: torch.Tensor):
    try:
        storage = t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        # No storage to read (functorch's batched tensors under vmap, some subclasses):
        # such calls run the graph with ATen ops, which handle aliasing themselves.
        return id(t)
    # empty storages all have address 0: they alias nothing
    return (storage.data_ptr(), t.device) if storage.nbytes() else id(t)


def _is_exact_by_equality(v) -> bool:
    """Tuple items for which ``==`` on the whole tuple is exact: no bool/int/float mixing,
    no signed zeros (``(1,) == (True,)`` and ``(0.0,) == (-0.0,)`` are both True)."""
    return v is None or type(v) in (int, str) or isinstance(v, torch.dtype)


def _is_plain_constant(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, torch.dtype)) or (
        isinstance(v, tuple) and all(_is_plain_constant(x) for x in v))


def is_numpy_scalar(value) -> bool:
    return type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and \
        hasattr(value, "item")


def is_constant_type(value) -> bool:
    """Values that are guarded by value (equality) rather than by identity."""
    return _is_plain_constant(value) or isinstance(value, (torch.device, torch.Size, slice,
                                                          type(Ellipsis))) or is_numpy_scalar(value)
