"""Reduction lowerings: sum, prod, mean, max/min, any/all, arg-max/min, var (two passes)."""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..index import contiguous_strides, flat_index, IndexExpr, unflatten
from ..ir import LoopValue, Unlowerable
from .core import aten, prims, register, square, _traced_meta
from .trace import DECOMPOSED_FROM
from .views import _view_of

# decompositions whose var_mean eager computes in float (``_var``)
_FLOAT_MOMENTS = (aten.native_layer_norm.default, aten.native_group_norm.default)


# --- reductions -----------------------------------------------------------------------------

def _norm_dims(dims, nd):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(nd))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % nd for d in dims}) if nd else []


def long_sum_accumulator(ctx, dtype, values: int):
    """The accumulator of a sum of ``values`` values of ``dtype``: float64 for a long float32
    sum. Why: a long float sum in one accumulator drifts (eager sums pairwise)."""
    if dtype == torch.float32 and ctx.options.size_choice("f64 accumulator",
                                                          values * ctx.options.dyn_scale > 4096):
        return torch.float64
    return dtype


def _reduce(ctx, node, x, dims, keepdim, rtype, out_dtype, pre=None, origin=""):
    """Reduction of ``x`` over ``dims``; ``pre(k, v)`` maps each loaded element first."""
    nd = len(x.sizes)
    dims = _norm_dims(dims, nd)
    rsizes = [x.sizes[d] for d in dims]
    kept = [d for d in range(nd) if d not in dims]
    out_sizes = [1 if d in dims else x.sizes[d] for d in range(nd)] if keepdim else [x.sizes[d] for d in kept]
    acc = long_sum_accumulator(ctx, out_dtype, math.prod(rsizes)) if rtype in ("sum", "prod") else out_dtype
    if rtype in ("argmax", "argmin"):
        acc = x.dtype

    def fn(k, idx, ridx):
        src = [None] * nd
        it_r = iter(ridx)
        if keepdim:
            for d in range(nd):
                src[d] = next(it_r) if d in dims else idx[d]
        else:
            it_o = iter(idx)
            for d in range(nd):
                src[d] = next(it_r) if d in dims else next(it_o)
        v = x.load(k, src)
        if pre is not None:
            v = pre(k, v, idx)
        return v
    split = split_plan(out_sizes, rsizes, rtype, ctx.options)
    if split is not None:
        return _split_reduction(ctx, out_sizes, rsizes, rtype, fn, out_dtype, acc, origin, *split)
    return ctx.reduction(out_sizes, rsizes, rtype, fn, out_dtype, acc, origin)


# --- split reductions (the GPU at fixed sizes) ------------------------------------------------
# A reduction with few results over many values runs as one GPU program per result (or, when
# the reduced dims are not the contiguous ones, one per few columns of results): BatchNorm's
# statistics over a channels-last (32, 64, 112, 112) activation were 8 programs for 64
# channels on a 132-SM GPU. Such a reduction is split: a first reduction gives S partial
# results per result, each over one S-th of a reduced dim, laid out (S, results...) so the
# results' contiguous dim stays contiguous, then a short reduction of the S partials. Only
# at fixed sizes (S depends on them) and for the associative reductions (not arg-max/min).
SPLIT_MIN_VALUES = 8192    # values per result below which one program is short anyway
SPLIT_MIN_PIECE = 1024     # values each partial reduces, at least
_SPLITTABLE = ("sum", "prod", "max", "min")
_HALF = (torch.float16, torch.bfloat16)


def split_plan(out_sizes, rsizes, rtype, options):
    """``(reduced dim, pieces)`` splitting this reduction, or None. ``options.split_reduction_results``
    is how many results (partials included) the target wants at least; 0: never split."""
    wanted = options.split_reduction_results
    results, values = math.prod(out_sizes), math.prod(rsizes)
    if not wanted or options.size_choices is not None or rtype not in _SPLITTABLE \
            or results >= wanted or values < SPLIT_MIN_VALUES:
        return None
    for dim, n in enumerate(rsizes):
        pieces = [d for d in range(2, n + 1) if n % d == 0 and values // d >= SPLIT_MIN_PIECE]
        if pieces:
            enough = [d for d in pieces if results * d >= wanted]
            return dim, (enough[0] if enough else pieces[-1])
    return None


def _split_reduction(ctx, out_sizes, rsizes, rtype, fn, out_dtype, acc, origin, dim, pieces):
    """The reduction ``fn`` over ``rsizes`` as partials over 1/``pieces`` of reduced dim
    ``dim`` each, then the reduction of the partials (accumulated in float32 for halves, as
    the unsplit reduction's accumulator is)."""
    piece = rsizes[dim] // pieces
    inner = list(rsizes)
    inner[dim] = piece
    part_dtype = torch.float32 if acc in _HALF else acc

    def part_fn(k, idx, ridx):
        full = list(ridx)
        full[dim] = idx[0] * piece + ridx[dim]
        return k.cast(fn(k, list(idx[1:]), full), part_dtype)
    part = ctx.reduction([pieces] + list(out_sizes), inner, rtype, part_fn, part_dtype, part_dtype,
                         f"{origin}(split {pieces})")

    def total_fn(k, idx, ridx):
        return part.load(k, [ridx[0]] + list(idx))
    return ctx.reduction(out_sizes, [pieces], rtype, total_fn, out_dtype, part_dtype, origin)


@register(aten.sum.dim_IntList, aten.sum.default, prims.sum.default)
def _sum(ctx, node, x, dims=None, keepdim=False, dtype=None, output_dtype=None):
    tm = _traced_meta(node)
    dt = tm.dtype
    return _reduce(ctx, node, x, dims, keepdim, "sum", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="sum")


@register(aten.prod.dim_int, aten.prod.default)
def _prod(ctx, node, x, dims=None, keepdim=False, dtype=None):
    tm = _traced_meta(node)
    dt = tm.dtype
    if isinstance(dims, torch.dtype):
        dims = None
    return _reduce(ctx, node, x, dims, keepdim, "prod", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="prod")


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx, node, x, dims=None, keepdim=False, dtype=None):
    tm = _traced_meta(node)
    dt = tm.dtype
    if isinstance(dims, torch.dtype):
        dims = None
    nd = len(x.sizes)
    n = math.prod(x.sizes[d] for d in _norm_dims(dims, nd)) if nd else 1
    s = _reduce(ctx, node, x, dims, keepdim, "sum", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="mean")

    def fn(k, idx):
        return k.op("div", [s.load(k, idx), k.const(n, dt)], dt)
    return LoopValue(s.sizes, dt, fn)


@register(aten.amax.default, aten.amin.default, prims.amax.default, prims.amin.default,
          aten.max.default, aten.min.default)
def _amax(ctx, node, x, dims=None, keepdim=False):
    tm = _traced_meta(node)
    rt = "max" if node.target in (aten.amax.default, prims.amax.default, aten.max.default) else "min"
    if x.numel == 0:
        raise Unlowerable("empty max")
    return _reduce(ctx, node, x, dims, keepdim, rt, tm.dtype, origin=rt)


@register(aten.any.dim, aten.any.dims, aten.any.default)
def _any(ctx, node, x, dims=None, keepdim=False):
    return _reduce(ctx, node, x, dims, keepdim, "max", torch.bool,
                   pre=lambda k, v, idx: k.cast(v, torch.bool), origin="any")


@register(aten.all.dim, aten.all.dims, aten.all.default)
def _all(ctx, node, x, dims=None, keepdim=False):
    return _reduce(ctx, node, x, dims, keepdim, "min", torch.bool,
                   pre=lambda k, v, idx: k.cast(v, torch.bool), origin="all")


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, node, x, dim=None, keepdim=False):
    if dim is None:
        flat = LoopValue((x.numel,), x.dtype, lambda k, idx: x.load(k, unflatten(IndexExpr.of(idx[0]), x.sizes)),
                         cost=x.cost)
        x, dim = flat, 0
        keepdim_eff = False
    else:
        keepdim_eff = keepdim
    if x.numel == 0:
        raise Unlowerable("empty argmax")
    rt = "argmax" if node.target is aten.argmax.default else "argmin"
    r = _reduce(ctx, node, x, [dim], keepdim_eff, rt, torch.int64, origin=rt)
    tm = _traced_meta(node)
    if r.sizes != tuple(tm.shape):
        return _view_of(r, tm.shape, lambda idx: unflatten(flat_index(idx, contiguous_strides(tm.shape)), r.sizes))
    return r


def _var(ctx, node, x, dims, correction, keepdim, want_mean):
    """Two passes: the mean ``m``, then the deviations from it, with the shifted-data
    correction ``var = (sum(d^2) - sum(d)^2 / n) / (n - correction)`` for ``d = x - m``,
    which cancels the error of ``m`` itself.

    Why: with a large mean (1e5, spread 0.1) a float32 sum misses the mean by ~1e-2 and a
    float32 mean is rounded by ~4e-3; either error squared was a relative error of 1e-2 in
    the variance. The accumulators are eager's: float64 on the CPU (ATen's Welford
    accumulates in double there; a LayerNorm's or GroupNorm's moments in float, as ATen's
    kernels for those, up to 4096 values a row), the input's float type on a GPU (float32
    for halves)."""
    nd = len(x.sizes)
    dl = _norm_dims(dims, nd)
    n = math.prod(x.sizes[d] for d in dl) if nd else 1
    dt = x.dtype if x.dtype.is_floating_point else torch.float32
    if not ctx.options.admits(dt):
        raise Unlowerable(f"dtype {dt}")
    src = node.args[0].meta.get("traced_meta") if node.args and isinstance(node.args[0], fx.Node) else None
    on_gpu = getattr(src, "device", None) is not None and src.device.type != "cpu"
    acc = torch.float64 if dt == torch.float64 or not on_gpu else torch.float32
    if acc == torch.float64 and dt != torch.float64 and node.meta.get(DECOMPOSED_FROM) in _FLOAT_MOMENTS and \
            not ctx.options.size_choice("f64 accumulator", n * ctx.options.dyn_scale > 4096):
        # eager's LayerNorm and GroupNorm kernels accumulate their moments in float (ATen's
        # RowwiseMoments); with the shift correction float is as accurate here, and twice
        # as wide in a vector register
        acc = torch.float32
    s = _reduce(ctx, node, x, dims, keepdim, "sum", acc, pre=lambda k, v, idx: k.cast(v, acc),
                origin="var(mean)")

    def shift(k, idx):
        return k.op("div", [s.load(k, idx), k.const(n, acc)], acc)

    def dev(k, v, idx):
        return k.op("sub", [k.cast(v, acc), shift(k, idx)], acc)
    sd = _reduce(ctx, node, x, dims, keepdim, "sum", acc, pre=dev, origin="var(shift)")
    ss = _reduce(ctx, node, x, dims, keepdim, "sum", acc,
                 pre=lambda k, v, idx: square(k, dev(k, v, idx), acc), origin="var")
    denom = max(n - (1 if correction is None else correction), 0)

    def var_fn(k, idx):
        d = sd.load(k, idx)
        # (sum of squared deviations - d * d / n) / denom, d the sum of deviations
        shift_error = k.op("div", [square(k, d, acc), k.const(n, acc)], acc)
        v = k.op("div", [k.op("sub", [ss.load(k, idx), shift_error], acc), k.const(denom, acc)], acc)
        return k.cast(v, dt)

    def mean_fn(k, idx):
        mean_dev = k.op("div", [sd.load(k, idx), k.const(n, acc)], acc)
        return k.cast(k.op("add", [shift(k, idx), mean_dev], acc), dt)
    var = LoopValue(s.sizes, dt, var_fn)
    mean = LoopValue(s.sizes, dt, mean_fn)
    return (var, mean) if want_mean else var


@register(aten.var.correction, aten.var.dim)
def _var_l(ctx, node, x, dims=None, unbiased=None, keepdim=False, correction=None):
    if node.target is aten.var.dim:
        correction = 1 if unbiased in (None, True) else 0
    elif correction is None:
        correction = 1
    return _var(ctx, node, x, dims, correction, keepdim, False)


@register(aten.var_mean.correction, aten.var_mean.dim)
def _var_mean(ctx, node, x, dims=None, correction=None, keepdim=False):
    if node.target is aten.var_mean.dim:
        correction = 1 if correction in (None, True) else 0
    return _var(ctx, node, x, dims, 1 if correction is None else correction, keepdim, True)


@register(prims.var.default)
def _pvar(ctx, node, x, dims, correction=1.0, output_dtype=None):
    return _var(ctx, node, x, dims, correction, False, False)


@register(aten._safe_softmax.default)
def _safe_softmax(ctx, node, x, dim, dtype=None):
    """Softmax whose fully masked rows (all -inf) give 0, not NaN: what the attention
    decomposition emits. Lowered here (it was an ATen fallback: ~50 µs a call on the test
    GPT) as the two row reductions of a softmax; a row is fully masked exactly when its max
    is -inf (a NaN anywhere makes the max NaN, and the row NaN, as in eager)."""
    dt = _traced_meta(node).dtype
    if not dt.is_floating_point:
        raise Unlowerable("integer softmax")
    nd = len(x.sizes)
    d = dim % nd if nd else 0
    if nd == 0 or x.numel == 0:
        raise Unlowerable("scalar or empty softmax")

    def xload(k, idx):
        return k.cast(x.load(k, idx), dt)
    xc = LoopValue(x.sizes, dt, xload, cost=x.cost)
    mx = _reduce(ctx, node, xc, [d], True, "max", dt, origin="softmax(max)")

    def row(idx):
        return [IndexExpr() if i == d else ix for i, ix in enumerate(idx)]

    def ex(k, idx):
        return k.op("exp", [k.op("sub", [xload(k, idx), mx.load(k, row(idx))], dt)], dt)
    s = _reduce(ctx, node, LoopValue(x.sizes, dt, ex, cost=x.cost + 2), [d], True, "sum", dt,
                origin="softmax(sum)")

    def out(k, idx):
        m = mx.load(k, row(idx))
        inf = k.const(float("-inf"), dt)
        masked = k.op("eq", [m, inf], dt)
        return k.op("where", [masked, k.const(0, dt), k.op("div", [ex(k, idx), s.load(k, row(idx))], dt)], dt)
    return LoopValue(x.sizes, dt, out, cost=x.cost + 4)
