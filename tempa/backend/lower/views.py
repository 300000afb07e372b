"""View and indexing lowerings: a view only changes the index function (no copy); cat, pad,
scatters and gathers become piecewise or indirect loads."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..index import Cond, contiguous_strides, flat_index, IndexExpr, unflatten
from ..ir import IndexCheck, LoopValue, Unlowerable
from .core import aten, bcast, _multi_metas, prims, register, _traced_meta
from .trace import UntraceableGraph


# --- views ----------------------------------------------------------------------------------

def _view_of(x: LoopValue, sizes, remap, cost_extra=0):
    """A view: new sizes and an index remap out-idx -> in-idx. Keeps strided-ness if affine."""
    sizes = tuple(int(s) for s in sizes)

    def load(k, idx):
        return x.load(k, remap(idx))
    strided = None
    if x.strided is not None:
        from ..index import Var
        b, st, off = x.strided
        probe = [IndexExpr.of(Var(f"_p{d}", s)) for d, s in enumerate(sizes)]
        src = remap(probe)
        flat = flat_index(src, st, off)
        # affine in the probe vars with no div/mod: representable as strides
        coefs = {a.name: c for a, c in flat.terms if isinstance(a, Var)}
        if all(isinstance(a, Var) for a, _ in flat.terms):
            new_st = tuple(coefs.get(f"_p{d}", 0) for d in range(len(sizes)))
            strided = (b, new_st, flat.const)
            return LoopValue.view_of(b, sizes, new_st, flat.const)
    return LoopValue(sizes, x.dtype, load, strided, x.cost)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
          aten._reshape_alias.default)
def _reshape(ctx, node, x, sizes=None, *rest):
    new = _traced_meta(node).shape
    return x if tuple(new) == x.sizes else reshaped(x, new)


def reshaped(x: LoopValue, sizes) -> LoopValue:
    """``x`` in ``sizes``, row-major (a view where ``x`` is strided memory)."""
    def remap(idx):
        return unflatten(flat_index(idx, contiguous_strides(sizes)), x.sizes)
    return _view_of(x, sizes, remap)


@register(aten.flatten.using_ints, aten.unflatten.int)
def _flatten(ctx, node, x, *dims):
    """A reshape to the traced shape. Why lowered: torch's batch-norm decomposition
    flattens the weight and bias; as ATen calls (two per BatchNorm: 106 in ResNet-50, 104 in
    MobileNetV2, ~0.3-0.5 ms a CPU call) each cost a host call and ended the kernel that normalises the convolution's output, so its
    affine part and ReLU read the activation again in a kernel of their own."""
    return _reshape(ctx, node, x, None)


@register(aten.permute.default, aten.permute_copy.default)
def _permute(ctx, node, x, dims):
    nd = len(x.sizes)
    dims = [d % nd for d in dims] if nd else []
    sizes = [x.sizes[d] for d in dims]
    inv = [0] * nd
    for i, d in enumerate(dims):
        inv[d] = i
    return _view_of(x, sizes, lambda idx: [idx[inv[d]] for d in range(nd)])


@register(aten.t.default)
def _t(ctx, node, x):
    if len(x.sizes) < 2:
        return x
    return _permute(ctx, node, x, [1, 0])


@register(aten.transpose.int)
def _transpose(ctx, node, x, a, b):
    nd = len(x.sizes)
    if nd == 0:
        return x
    dims = list(range(nd))
    a, b = a % nd, b % nd
    dims[a], dims[b] = dims[b], dims[a]
    return _permute(ctx, node, x, dims)


@register(aten.expand.default, aten.expand_copy.default)
def _expand(ctx, node, x, sizes, implicit=False):
    tm = _traced_meta(node)
    out = tm.shape
    bcast(x, out)                   # raises Unlowerable where the sizes do not broadcast
    nd, m = len(out), len(x.sizes)

    def remap(idx):
        sub = list(idx[nd - m:])
        for d in range(m):
            if x.sizes[d] == 1 and out[nd - m + d] != 1:
                sub[d] = IndexExpr()
        return sub
    return _view_of(x, out, remap)


@register(aten.unsqueeze.default)
def _unsqueeze(ctx, node, x, dim):
    tm = _traced_meta(node)
    dim = dim % (len(x.sizes) + 1)
    return _view_of(x, tm.shape, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]))


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(ctx, node, x, dims=None):
    tm = _traced_meta(node)
    nd = len(x.sizes)
    if dims is None:
        dims = [d for d in range(nd) if x.sizes[d] == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = {d % nd for d in dims if x.sizes[d % nd] == 1} if nd else set()
    keep = [d for d in range(nd) if d not in dims]

    def remap(idx):
        out = [IndexExpr()] * nd
        for j, d in enumerate(keep):
            out[d] = idx[j]
        return out
    return _view_of(x, tm.shape, remap)


def _slice_bounds(start, end, size):
    """``start`` and ``end`` of ``x[start:end]`` along a dim of ``size``, as ATen's slice
    normalises them: None is the whole dim, a negative bound counts from the end, and both
    are clamped into ``[0, size]`` with ``end >= start``. Why clamp: ``x[-4095:]`` of a
    16-long dim (a sliding-window KV cache) is the whole dim; unclamped, slice_scatter's
    source index ``i - start`` would read far outside its buffer."""
    start = 0 if start is None else start
    end = size if end is None else end
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end


@register(aten.slice.Tensor)
def _slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    tm = _traced_meta(node)
    nd = len(x.sizes)
    dim = dim % nd
    start, _ = _slice_bounds(start, end, x.sizes[dim])

    def remap(idx):
        out = list(idx)
        out[dim] = IndexExpr.of(idx[dim]) * step + start
        return out
    return _view_of(x, tm.shape, remap)


@register(aten.select.int)
def _select(ctx, node, x, dim, index):
    tm = _traced_meta(node)
    nd = len(x.sizes)
    dim = dim % nd
    index = index + x.sizes[dim] if index < 0 else index
    return _view_of(x, tm.shape, lambda idx: list(idx[:dim]) + [IndexExpr(const=index)] + list(idx[dim:]))


@register(aten.as_strided.default)
def _as_strided(ctx, node, x, size, stride, storage_offset=None):
    if x.storage_buffer is None:
        # A computed value (decompositions such as group_norm's use as_strided on results).
        # Traced contiguous, its elements lie in eager's storage in row-major order from its
        # storage offset on, so the view is an index remap, as long as it reads only the
        # value's own elements (the offset taken relative to the value's first one).
        # Anything else addresses storage the value does not hold: an ATen call on a copy
        # of the value (a fresh storage) would read other elements, so the graph is refused
        # and runs as eager ATen calls. (A slice of a flattened activation was such a
        # copy: wrong values, or a storage-bounds error where eager runs.)
        tm = node.args[0].meta.get("traced_meta") if isinstance(node.args[0], fx.Node) else None
        rel = (storage_offset or 0) - (tm.offset if tm is not None else 0)
        span = rel + sum((s - 1) * st for s, st in zip(size, stride) if s > 0)
        if tm is None or tuple(tm.stride) != contiguous_strides(tm.shape) \
                or any(st < 0 for st in stride) or rel < 0 or span >= max(x.numel, 1):
            raise UntraceableGraph("as_strided of a computed value addressing storage it does not hold")
        return _view_of(x, size, lambda idx: unflatten(flat_index(idx, stride, rel), x.sizes))
    b = x.storage_buffer
    off = b.offset if storage_offset is None else storage_offset
    return LoopValue.view_of(b, tuple(size), tuple(stride), off)


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def _split(ctx, node, x, sizes_or_size=None, dim=0):
    metas = _multi_metas(node)
    if node.target is aten.unbind.int:
        dim = sizes_or_size if sizes_or_size is not None else 0
    nd = len(x.sizes)
    dim = dim % nd
    outs, start = [], 0
    for m in metas:
        if m is None:
            raise Unlowerable("unused split piece")
        if node.target is aten.unbind.int:
            s0 = start

            def remap(idx, s0=s0):
                return list(idx[:dim]) + [IndexExpr(const=s0)] + list(idx[dim:])
            outs.append(_view_of(x, m.shape, remap))
            start += 1
        else:
            s0 = start

            def remap(idx, s0=s0):
                out = list(idx)
                out[dim] = IndexExpr.of(idx[dim]) + s0
                return out
            outs.append(_view_of(x, m.shape, remap))
            start += m.shape[dim]
    return tuple(outs)


@register(aten.cat.default)
def _cat(ctx, node, tensors, dim=0):
    tm = _traced_meta(node)
    tensors = [t for t in tensors if not (len(t.sizes) == 1 and t.sizes[0] == 0)]
    nd = len(tm.shape)
    dim = dim % nd
    bounds, acc = [], 0
    for t in tensors:
        acc += t.sizes[dim]
        bounds.append(acc)
    dt = tm.dtype

    def fn(k, idx):
        i = idx[dim]
        branches = []
        lo = 0
        for t, hi in zip(tensors, bounds):
            def br(k, t=t, lo=lo):
                sub = list(idx)
                sub[dim] = IndexExpr.of(i) - lo
                return k.cast(bcast(t, tuple(sub_sz(t, tm.shape, dim)))(k, sub) if False else t.load(k, sub), dt)
            branches.append((Cond.compare(i, "<", hi), br))
            lo = hi
        return k.piecewise(branches, dt)
    return LoopValue(tm.shape, dt, fn, cost=2 + sum(t.cost for t in tensors))


def sub_sz(t, shape, dim):
    return shape


@register(aten.constant_pad_nd.default)
def _pad(ctx, node, x, pad, value=0):
    tm = _traced_meta(node)
    nd = len(x.sizes)
    dt = tm.dtype
    lows = [0] * nd
    for i in range(len(pad) // 2):
        lows[nd - 1 - i] = pad[2 * i]

    def fn(k, idx):
        src = [IndexExpr.of(i) - lo for i, lo in zip(idx, lows)]
        inside = Cond()
        for d in range(nd):
            if lows[d] or x.sizes[d] != tm.shape[d]:
                inside = inside & Cond.within(src[d], 0, x.sizes[d])
        if inside.always:
            return k.cast(x.load(k, src), dt)
        return k.piecewise([(inside, lambda k: k.cast(x.load(k, src), dt)),
                            (Cond(), lambda k: k.const(value, dt))], dt)
    return LoopValue(tm.shape, dt, fn, cost=2 + x.cost)


@register(aten.slice_scatter.default)
def _slice_scatter(ctx, node, base, src, dim=0, start=None, end=None, step=1):
    tm = _traced_meta(node)
    nd = len(tm.shape)
    dim = dim % nd
    start, end = _slice_bounds(start, end, tm.shape[dim])
    dt = tm.dtype

    def fn(k, idx):
        i = IndexExpr.of(idx[dim])
        cond = Cond.within(i, start, end)
        if step != 1:
            cond = cond & Cond.compare(i - start, "==", 0, modulus=step)

        def from_src(k):
            sub = list(idx)
            sub[dim] = (i - start).floordiv(step) if step != 1 else i - start
            return k.cast(src.load(k, sub), dt)
        return k.piecewise([(cond, from_src), (Cond(), lambda k: k.cast(base.load(k, list(idx)), dt))], dt)
    return LoopValue(tm.shape, dt, fn, cost=2 + base.cost + src.cost)


@register(aten.select_scatter.default)
def _select_scatter(ctx, node, base, src, dim, index):
    tm = _traced_meta(node)
    nd = len(tm.shape)
    dim = dim % nd
    index = index + tm.shape[dim] if index < 0 else index
    dt = tm.dtype

    def fn(k, idx):
        i = IndexExpr.of(idx[dim])

        def from_src(k):
            return k.cast(src.load(k, list(idx[:dim]) + list(idx[dim + 1:])), dt)
        return k.piecewise([(Cond.compare(i, "==", index), from_src),
                            (Cond(), lambda k: k.cast(base.load(k, list(idx)), dt))], dt)
    return LoopValue(tm.shape, dt, fn, cost=2 + base.cost + src.cost)


# Most index entries per output element that a pointwise scatter_add tests (one compare
# and select each); beyond this the ATen scatter runs.
SCATTER_ADD_MAX_HITS = 4


@register(aten.scatter_add.default)
def _scatter_add(ctx, node, base, dim, index, src):
    """``out[i][j] = base[i][j] + sum_t (j == index[i][t]) * src[i][t]`` (dim 1 shown) when
    ``index`` is short along ``dim`` and spans ``base`` along the others: each output element
    is a pointwise function of ``index``/``src``. Why: cross-entropy's backward scatters one
    gradient per row into a (rows, vocab) zeros tensor; as a fallback that writes and re-reads
    the whole dense tensor (1.6 GB for a GPT's 8192 x 50304 logits in fp32), as a pointwise
    it fuses into the softmax backward that follows."""
    tm = _traced_meta(node)
    nd = len(tm.shape)
    if nd == 0 or not isinstance(index, LoopValue) or not isinstance(src, LoopValue):
        raise Unlowerable("scatter_add of a scalar")
    dim = dim % nd
    hits = index.sizes[dim]
    if (len(index.sizes) != nd or len(src.sizes) != nd or hits > SCATTER_ADD_MAX_HITS
            or any(index.sizes[d] != tm.shape[d] for d in range(nd) if d != dim)
            or any(src.sizes[d] < index.sizes[d] for d in range(nd))):
        raise Unlowerable("scatter_add with a long or partial index")
    dt = tm.dtype
    check = _dim_bounds(dim, "scatter_add")

    def fn(k, idx):
        acc = k.cast(base.load(k, list(idx)), dt)
        here = k.index(IndexExpr.of(idx[dim]))
        for t in range(hits):
            sub = list(idx)
            sub[dim] = IndexExpr(const=t)
            target = k.cast(index.load(k, sub), torch.int64)
            k.flag_out_of_range(target, tm.shape[dim], check)
            hit = k.op("eq", [here, target], torch.int64)
            add = k.op("where", [hit, k.cast(src.load(k, sub), dt), k.const(0, dt)], dt)
            acc = k.op("add", [acc, add], dt)
        return acc
    return LoopValue(tm.shape, dt, fn, cost=2 + base.cost + hits * (2 + index.cost + src.cost))


# --- indexing -------------------------------------------------------------------------------

# What eager raises for an index out of range, per op (checked in the kernel, raised by the
# wrapper: an error must never become data, e.g. a -1 wrapping to the last row).
_SELF_RANGE = IndexCheck(False, "IndexError", "index out of range in self")   # embedding, index_select


def _dim_bounds(dim, op):
    """gather and scatter: RuntimeError, negatives included (eager: "index -1 is out of
    bounds for dimension 1 with size 3")."""
    return IndexCheck(False, "RuntimeError", f"index is out of bounds for dimension {dim} ({op})")


def _gather_cost(source, index) -> int:
    """A gathered value's cost: the indirect load, plus computing the index and the source
    element it reads, which its loader recomputes wherever it is inlined. Why counted: T5's
    relative position bias is an embedding of buckets computed with a log per element; costed
    as a plain load it was inlined into every layer's softmax, recomputed in each of its
    three passes (6 layers: 45 ms of a 225 ms call), where eager computes it once."""
    return 2 + sum(v.cost for v in (source, index) if isinstance(v, LoopValue))


@register(aten.embedding.default)
def _embedding(ctx, node, weight, indices, padding_idx=-1, *rest):
    tm = _traced_meta(node)
    ni = len(indices.sizes)
    rows = weight.sizes[0]

    def fn(k, idx):
        row = k.indirect(indices.load(k, list(idx[:ni])), rows, _SELF_RANGE)
        return weight.load(k, [row] + list(idx[ni:]))
    return LoopValue(tm.shape, tm.dtype, fn, cost=_gather_cost(weight, indices))


@register(aten.index_select.default)
def _index_select(ctx, node, x, dim, index):
    tm = _traced_meta(node)
    nd = len(x.sizes)
    dim = dim % nd if nd else 0

    def fn(k, idx):
        j = k.indirect(index.load(k, [idx[dim]] if index.sizes else []), x.sizes[dim], _SELF_RANGE)
        sub = list(idx)
        sub[dim] = j
        return x.load(k, sub)
    return LoopValue(tm.shape, tm.dtype, fn, cost=_gather_cost(x, index))


@register(aten.gather.default)
def _gather(ctx, node, x, dim, index, sparse_grad=False):
    tm = _traced_meta(node)
    nd = len(x.sizes)
    if nd == 0:
        raise Unlowerable("0-d gather")
    dim = dim % nd

    check = _dim_bounds(dim, "gather")

    def fn(k, idx):
        j = k.indirect(index.load(k, list(idx)), x.sizes[dim], check)
        sub = list(idx)
        sub[dim] = j
        return x.load(k, sub)
    return LoopValue(tm.shape, tm.dtype, fn, cost=_gather_cost(x, index))


@register(aten.index.Tensor)
def _index(ctx, node, x, indices):
    tm = _traced_meta(node)
    tens = [(d, t) for d, t in enumerate(indices) if t is not None]
    if len(tens) != 1 or tens[0][1].dtype not in (torch.int64, torch.int32):
        raise Unlowerable("advanced indexing beyond one integer index tensor")
    d, it = tens[0]
    ni = len(it.sizes)
    check = IndexCheck(True, "IndexError", f"index is out of bounds for dimension {d} (indexing)")

    def fn(k, idx):
        j = k.indirect(it.load(k, list(idx[d:d + ni])), x.sizes[d], check)
        sub = list(idx[:d]) + [j] + list(idx[d + ni:])
        return x.load(k, sub)
    return LoopValue(tm.shape, tm.dtype, fn, cost=_gather_cost(x, it))


@register(prims.broadcast_in_dim.default)
def _bid(ctx, node, x, shape, bdims):
    def remap(idx):
        return [IndexExpr() if x.sizes[j] == 1 and shape[d] != 1 else idx[d] for j, d in enumerate(bdims)]
    return _view_of(x, shape, remap)
