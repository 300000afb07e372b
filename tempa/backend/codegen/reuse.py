"""Keep a sum's terms for the loop after it instead of computing them twice.

Softmax renders as three loops over a row: the max, the sum of ``exp(x - max)``, and the
output ``exp(x - max) / sum``. The output loop computes every ``exp`` a second time. When the
row length is a compile-time constant gcc sometimes unrolls both loops completely and shares
the calls; with a symbolic length (shape-generic code, backend/dynamic.py), or a long row, it
cannot, and the ``exp`` calls dominate: the test GPT's attention softmax at (B, T) = (4, 64)
took 2x as long in its shape-generic build as in its static one.

So: when a sum's loop runs over exactly the positions of a later pointwise member's row, the
sum's loop also stores each term into that member's output, and the member's loop reads it
back wherever its expression computes the same value (matched by the emitter's canonical
forms, emit.py). If the member never computes that value, both the store and the read are
dropped. The stored value is the one the sum added, so the result is unchanged, bit for bit
up to the math library's vector and scalar paths agreeing.
"""
from __future__ import annotations

from ..ir import Reduction
from ..schedule import _reads, member_index


def reuse_pairs(members, ov, local) -> dict:
    """{sum member: the pointwise member whose output row can hold the sum's terms}.

    Conditions (each needed for the store to be both safe and useful):
    * the sum has one reduction dim and no loops of its own besides it (its terms are then
      indexed by the outer loop variables plus one row variable);
    * the pointwise member comes later in the group, has exactly one inner loop of the same
      length, is written to memory we allocated (not an alias of an input, not a register
      local), and has the sum's accumulator dtype (the stored term is not rounded);
    * no member of the group reads that output (the stored terms are overwritten by the
      member's own loop before anyone looks), and no other sum already uses it.
    """
    out: dict = {}
    taken: set = set()
    read_here: set = set()
    for m in members:
        read_here |= _reads(m)
    read_here |= {b.target for b in read_here if getattr(b, "kind", None) == "alias"}
    for i, r in enumerate(members):
        body = r.body
        if not isinstance(body, Reduction) or body.rtype != "sum" or len(body.rsizes) != 1:
            continue
        if member_index(r, ov, "z")[1]:
            continue
        for p in members[i + 1:]:
            if isinstance(p.body, Reduction) or p in local or p in taken or p in read_here:
                continue
            if p.kind not in ("py", "internal") or p.dtype != body.acc_dtype:
                continue
            inner = member_index(p, ov, f"i_{p.name}_")[1]
            if len(inner) == 1 and inner[0].size == body.rsizes[0]:
                out[r] = p
                taken.add(p)
                break
    return out
