"""A Linear weight packed once for MKL's packed GEMM (``options={"freezing": True}``).

Why: eager's ``addmm(b, x, w.t())`` hands MKL the weight as it is, and MKL repacks it into
its blocked layout on every call; ``mkl::_mkl_linear`` with a weight packed by
``mkl::_mkl_reorder_linear_weight`` skips that (GPT-2's 768x3072 layers at 130 rows: 3.75
-> 3.23 ms a call, its LM head at 64 rows: 54 -> 39 ms; same results at 64 rows and more).
lower/matmul.py decides where it pays; the generated wrapper calls ``cache(w)`` for the
packed argument on every call.

The packed copy is only right while the weight holds the values it was packed from, so each
call compares the weight with what was packed: the same tensor object (held, so that its id
cannot be reused by another), its version counter (every in-place write through autograd's
view of it bumps it: an optimizer's step, ``load_state_dict``, ``w.add_(1)`` under
no_grad), its data pointer, sizes, strides and dtype (a ``.data =`` assignment changes those
without a bump); any difference packs again. What no cheap check sees is a write through
``w.data`` (``w.data.add_(1)``: ``.data`` is another tensor with its own version counter):
that is the option's contract, said in the README and the perf log. A weight that cannot be
packed or checked (an inference tensor has no version counter; not fp32, not a contiguous
matrix) is passed unpacked: ``_mkl_linear`` then runs ``linear`` on it, eager's GEMM.
"""
from __future__ import annotations

import torch


class PackedWeightCache:
    """``cache(w)``: ``w`` packed for ``rows`` rows (packed again when ``w`` changed), or
    ``w`` itself where it cannot be packed. ``w`` is N x K as nn.Linear stores it, or K x N
    where ``stored_kn`` (HF's Conv1D: packed from its transpose). ``input_index``: which
    graph input ``w`` is; ``packs``: how many packings were done so far."""
    __slots__ = ("input_index", "rows", "stored_kn", "state", "packs")

    def __init__(self, input_index: int, rows: int, stored_kn: bool = False):
        self.input_index = input_index
        self.rows = rows
        self.stored_kn = stored_kn
        # (weight, version, data_ptr, shape, stride, dtype, packed), read and replaced as one
        # object so that a concurrent call never pairs one weight's check with another's packing
        self.state = (None,) * 7
        self.packs = 0

    def __call__(self, w):
        s = self.state
        if (w is s[0] and w._version == s[1] and w.data_ptr() == s[2] and w.shape == s[3]
                and w.stride() == s[4] and w.dtype is s[5]):
            return s[6]
        return self._pack(w)

    def __repr__(self):
        return f"PackedWeightCache(input {self.input_index}, {self.rows} rows, packed {self.packs}x)"

    def _pack(self, w):
        if w.is_inference() or w.dtype is not torch.float32 or w.dim() != 2 or not w.is_contiguous() \
                or w.device.type != "cpu":
            self.state = (None,) * 7
            return w
        version = w._version           # read before packing: a write during it repacks next call
        with torch.no_grad():
            w_nk = w.detach().t().contiguous() if self.stored_kn else w.detach()
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w_nk, self.rows)
        self.state = (w, version, w.data_ptr(), w.shape, w.stride(), w.dtype, packed)
        self.packs += 1
        return packed
