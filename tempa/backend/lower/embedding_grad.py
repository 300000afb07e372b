"""A tied embedding's gradient, added into the other gradient of the same weight in place.

A language model whose output layer shares the token embedding's weight (GPT-2, T5) has one
gradient for that weight made of two terms: the output layer's GEMM (vocab x d) and the
embedding's backward, ``embedding_dense_backward``, which is a zero (vocab x d) tensor with
the token rows of the output gradient added in. Computed as written, each step fills
vocab x d with zeros, adds a few hundred rows into it, and adds the two (vocab x d) terms:
three passes over 154 MB at GPT-2's vocabulary, and two fresh allocations of that size whose
pages the kernel maps again on every call. On the CPU this graph instead adds the token rows
straight into the GEMM's fresh output (``index_add_``): the same sum, one extern call over
the few rows. (torch.compile folds the add into the GEMM as ``addmm`` and keeps the zero
fill; GPT-2 124M's training step was 1.19x eager with it against tempa's 1.07x.)

Only where that is sound: the GEMM's output is memory ATen allocated for this graph, read by
nothing but the sum; the embedding has no padding row and no scaling by frequency; on the
CPU, where ``index_add_`` adds in index order (on a GPU it adds with atomics, in no fixed
order). Otherwise the sum is lowered as written.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..index import contiguous_strides
from ..ir import Buffer, ComputedBuffer, ExternCall, LoopValue
from .core import VIEW_OPS
from .views import reshaped

aten = torch.ops.aten

_FRESH_PRODUCERS = (aten.mm.default, aten.addmm.default)


def add_rows_in_place(ctx, node: fx.Node, args, kwargs):
    """``node`` (an ``add``) as ``index_add_`` of the embedding's gradient rows into the GEMM
    output it sums with, or None where that rewrite does not apply."""
    if node.target is not aten.add.Tensor or kwargs or len(node.args) != 2 or len(args) != 2:
        return None
    tm = node.meta.get("traced_meta")
    if tm is None or getattr(tm.device, "type", None) != "cpu" or tm.offset \
            or tuple(tm.stride) != contiguous_strides(tm.shape) or len(tm.shape) != 2:
        return None
    a, b = node.args
    for gemm, emb, x, e in ((a, b, args[0], args[1]), (b, a, args[1], args[0])):
        v = _into(ctx, node, gemm, emb, x, e)
        if v is not None:
            return v
    return None


def _into(ctx, node, gemm, emb, x, e):
    if not (isinstance(gemm, fx.Node) and isinstance(emb, fx.Node)):
        return None
    if emb.target is not aten.embedding_dense_backward.default or len(emb.users) != 1:
        return None
    padding_idx, by_freq = emb.args[3], emb.args[4]
    if padding_idx != -1 or by_freq:
        return None
    if not _only_reader_of_a_gemm(gemm):
        return None
    tm = node.meta["traced_meta"]
    if not (isinstance(x, LoopValue) and isinstance(e, LoopValue)) or x.sizes != e.sizes \
            or x.sizes != tuple(tm.shape) or x.dtype != tm.dtype or e.dtype != tm.dtype:
        return None
    emb_call = _producer(ctx, e)
    if not _fresh_extern_output(ctx, x) or emb_call is None:
        return None
    grad, ids = emb_call.args[0], emb_call.args[1]
    if not (isinstance(grad, LoopValue) and isinstance(ids, LoopValue)):
        return None
    rows, width = ids.numel, tm.shape[1]
    if grad.sizes != ids.sizes + (width,):
        return None
    ids_flat = ctx.strided_or_realize(reshaped(ids, (rows,)), "index of index_add_")
    rows_flat = ctx.strided_or_realize(reshaped(grad, (rows, width)), "source of index_add_")
    out = Buffer(ctx.name(), tuple(tm.shape), tuple(tm.stride), 0, tm.dtype)
    op = aten.index_add_.default
    ctx.g.steps.append(ExternCall(str(op), op, (x, 0, ids_flat, rows_flat), {}, [out], False))
    ctx.g.externs.append(str(op))
    # the embedding's own call now has no reader: eliminate_dead drops it
    ctx.g.externs.remove(emb_call.name)
    return LoopValue.of_buffer(out)


def _only_reader_of_a_gemm(n) -> bool:
    """Whether ``n`` is a GEMM's result, or a view of one, that only the sum reads (the
    output layer's weight gradient is a (d x vocab) product transposed, which the matmul
    lowering computes in place as the (vocab x d) one; ``_fresh_extern_output`` then checks
    that the value is all of that memory)."""
    while len(n.users) == 1:
        if n.target in _FRESH_PRODUCERS:
            return True
        if n.target not in VIEW_OPS or not isinstance(n.args[0], fx.Node):
            return False
        n = n.args[0]
    return False


def _fresh_extern_output(ctx, x) -> bool:
    """Whether ``x`` is all of a buffer an ATen call of this graph allocated."""
    if x.strided is None:
        return False
    buf, strides, offset = x.strided
    if isinstance(buf, ComputedBuffer) or buf.kind != "py" or offset or buf.base_offset \
            or tuple(buf.sizes) != x.sizes or tuple(strides) != contiguous_strides(x.sizes) \
            or tuple(buf.strides) != tuple(strides):
        return False
    return _producer(ctx, x) is not None


def _producer(ctx, v):
    """The ExternCall of this graph whose output ``v`` is all of, else None."""
    if v.strided is None:
        return None
    buf = v.strided[0]
    for st in reversed(ctx.g.steps):
        if isinstance(st, ExternCall) and any(o is buf for o in st.outputs):
            return st
    return None

