"""The loop IR's scalar operations, by name.

An IR body computes one element with ``k.op(name, args, dtype)``: ``name`` is a key of
``OPS``, ``args`` are scalar values already cast to ``dtype`` (the dtype the op computes
in), and the result has the dtype the op's rule gives. Each renderer spells every op from
its own table, side by side: C++ in ``codegen/emit.py`` (``CPP_OPS``), Triton in
``codegen/triton_emit.py`` (``TRITON_OPS``); tests/backend/test_ops.py checks that both
cover exactly this list. An op missing from a renderer's table is an ``UnknownOp`` error
when rendered, never a silent ATen fallback.

Lowerings compose these: ``x + y * alpha`` is ``add(x, mul(y, alpha))``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int
    predicate: bool     # True: the result is bool (a comparison or a test); else the compute dtype
    doc: str


class UnknownOp(Exception):
    """An op name no table defines, or a renderer lacks: a bug in tempa, not a gap to fall
    back from (``Unlowerable`` is the one a lowering may raise to run ATen instead)."""


def _ops(arity: int, predicate: bool, names_docs: str) -> list:
    """``"name: what it computes; ..."`` -> OpDefs (keeps the table below one line per op)."""
    out = []
    for item in names_docs.split(";"):
        name, doc = item.split(":", 1)
        out.append(OpDef(name.strip(), arity, predicate, doc.strip()))
    return out


OPS: dict = {d.name: d for d in (
    _ops(1, False, """
        neg: -x; abs: |x|; exp: e**x; exp2: 2**x; log: ln x; log2: log2 x; log10: log10 x;
        log1p: ln(1 + x); expm1: e**x - 1; sqrt: square root; rsqrt: 1 / sqrt(x);
        sin: sine; cos: cosine; tan: tangent; tanh: hyperbolic tangent; sinh: hyperbolic sine;
        cosh: hyperbolic cosine; asin: arc sine; acos: arc cosine; atan: arc tangent;
        asinh: inverse hyperbolic sine; acosh: inverse hyperbolic cosine;
        atanh: inverse hyperbolic tangent; erf: error function; erfc: 1 - erf(x);
        lgamma: ln |gamma(x)|; sigmoid: 1 / (1 + e**-x); relu: max(x, 0), NaN stays NaN;
        floor: round down (integers unchanged); ceil: round up (integers unchanged);
        round: round half to even (integers unchanged); trunc: round toward zero (integers unchanged);
        sign: -1, 0 or 1 (bool unchanged); reciprocal: 1 / x; bitwise_not: ~x (bool: not x)""")
    + _ops(1, True, "logical_not: x is zero; isnan: x is NaN")
    + _ops(2, False, """
        add: x + y; sub: x - y; mul: x * y; div: x / y (integers: truncating);
        maximum: the larger, NaN if either is (bool: or); minimum: the smaller, NaN if either is (bool: and);
        pow: x ** y; atan2: arc tangent of x / y, in the quadrant of (y, x); fmod: remainder with the sign of x;
        remainder: remainder with the sign of y; floordiv: x / y rounded down;
        bitwise_and: x & y; bitwise_or: x | y; bitwise_xor: x ^ y""")
    + _ops(2, True, """
        eq: x == y; ne: x != y; lt: x < y; le: x <= y; gt: x > y; ge: x >= y;
        logical_and: both non-zero; logical_or: either non-zero; logical_xor: exactly one non-zero""")
    + _ops(3, False, "where: y if x else z (x bool, y and z in the compute dtype)")
)}


def result_dtype(name: str, dtype):
    """The dtype of ``name`` computed in ``dtype``."""
    return torch.bool if lookup(name).predicate else dtype


def lookup(name: str) -> OpDef:
    op = OPS.get(name)
    if op is None:
        raise UnknownOp(f"no loop-IR op named {name!r} (tempa/backend/ops.py lists them)")
    return op


def spelling(table: dict, name: str, arity: int, renderer: str):
    """``table[name]`` after checking that ``name`` is an op taking ``arity`` arguments."""
    op = lookup(name)
    if op.arity != arity:
        raise UnknownOp(f"{name} takes {op.arity} arguments, got {arity}")
    spelled = table.get(name)
    if spelled is None:
        raise UnknownOp(f"the {renderer} renderer has no spelling for op {name!r}")
    return spelled
