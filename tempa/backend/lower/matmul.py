"""Matmul lowerings: small ones become reduction loops in the kernel file, big ones (and
convolution, attention) are extern calls into ATen's tuned libraries."""
from __future__ import annotations

import time

import torch
import torch.fx as fx

from ..index import contiguous_strides
from ..ir import LoopValue, PackedWeight, Unlowerable
from .core import aten, pointwise, probe, register, SMALL_MATMUL_MACS
from .depthwise import depthwise_backward


# --- matmul: small ones are loops in the kernel file, big ones call ATen ---------------------

def _mm_tv(ctx, node, a, b, batch):
    """out[..., i, j] = sum_k a[..., i, k] * b[..., k, j] as a reduction."""
    *bs, m, kk = a.sizes
    n = b.sizes[-1]
    dt = a.dtype
    if dt not in (torch.float32, torch.float64) or b.dtype != dt:
        raise Unlowerable("integer matmul")
    # A pure view (cost 0: only index arithmetic, e.g. heads merged into the batch with // and
    # %) is read in place; anything computed is stored once, not recomputed per multiply-add.
    a = a if a.cost == 0 else ctx.strided_or_realize(a, "matmul operand")
    b = b if b.cost == 0 else ctx.strided_or_realize(b, "matmul operand")
    out = tuple(bs) + (m, n)

    def fn(k, idx, ridx):
        r = ridx[0]
        av = a.load(k, list(idx[:-2]) + [idx[-2], r])
        bv = b.load(k, list(idx[:-2]) + [r, idx[-1]])
        return k.op("mul", [av, bv], dt)
    return ctx.reduction(out, (kk,), "sum", fn, dt, dt, origin="matmul")


# The generated matmul is a reduction loop over k, innermost: it vectorises only when both
# operands step by one element along k. Otherwise (the backward's grad_out^T @ x, w without
# its transpose) each multiply-add is a strided gather, ~10x slower than the library beyond
# tiny sizes (measured on the test GPT's backward: 850 us for ~400k MACs inline).
SMALL_STRIDED_MATMUL_MACS = 1 << 13


def _kstride(tv, dim):
    """The element step of ``tv`` along ``dim`` as the generated loop will read it (None when
    the index is not affine in that dim)."""
    from ..index import FloorDiv, Mod, Var
    dim %= len(tv.sizes)
    if tv.sizes[dim] == 1:
        return 1
    if tv.cost != 0 and tv.strided is None:          # realized contiguous first (_mm_tv)
        return contiguous_strides(tv.sizes)[dim]
    loads, _ = probe(tv, "_k")
    if len(loads) != 1:
        return None
    ix = loads[0][1]
    name = f"_k{dim}"
    if any(isinstance(a, (FloorDiv, Mod)) and any(getattr(v, "name", None) == name for v in a.e.vars())
           for a, _ in ix.terms):
        return None
    return next((c for a, c in ix.terms if isinstance(a, Var) and a.name == name), 0)


def _small(ctx, macs, a=None, b=None):
    unit = a is None or (_kstride(a, -1) == 1 and _kstride(b, -2) == 1)
    limit = SMALL_MATMUL_MACS if unit else SMALL_STRIDED_MATMUL_MACS
    return ctx.options.size_choice("inline matmul", macs * ctx.options.dyn_scale <= limit)


@register(aten.mm.default)
def _mm(ctx, node, a, b):
    m, k = a.sizes
    n = b.sizes[1]
    if not _small(ctx, m * n * k, a, b) or k == 0:
        packed = _packed_linear(ctx, node, a, b, None, x_node=node.args[0])
        return packed if packed is not None else ctx.extern(node, (a, b), {}, fallback=False)
    return _mm_tv(ctx, node, a, b, False)


@register(aten.bmm.default)
def _bmm(ctx, node, a, b):
    bsz, m, k = a.sizes
    n = b.sizes[2]
    if not _small(ctx, bsz * m * n * k, a, b) or k == 0:
        return ctx.extern(node, (a, b), {}, fallback=False)
    return _mm_tv(ctx, node, a, b, True)


@register(aten.addmm.default)
def _addmm(ctx, node, bias, a, b, beta=1, alpha=1):
    m, k = a.sizes
    n = b.sizes[1]
    if not _small(ctx, m * n * k, a, b) or k == 0:
        opts = ctx.options
        if beta == 1 and alpha == 1 and k and opts.size_choice(
                "addmm as mm", m * n * k * opts.dyn_scale <= opts.addmm_as_mm_macs):
            mm = ctx.extern(node, (a, b), {}, fallback=False, op=aten.mm.default, arg_nodes=node.args[1:3])
            half = mm.dtype in (torch.float16, torch.bfloat16)
            return pointwise(node, "add", [mm, bias], compute=torch.float32 if half else None)
        packed = _packed_linear(ctx, node, a, b, bias, x_node=node.args[1], bias_node=node.args[0]) \
            if beta == 1 and alpha == 1 else None
        if packed is not None:
            return packed
        return ctx.extern(node, (bias, a, b), {"beta": beta, "alpha": alpha}, fallback=False)
    mm = _mm_tv(ctx, node, a, b, False)
    if alpha != 1 or beta != 1:
        return pointwise(node, _scaled_sum, [mm, bias, alpha, beta])
    return pointwise(node, "add", [mm, bias])


def _scaled_sum(k, vals, dt):
    """mm * alpha + bias * beta"""
    mm, bias, alpha, beta = vals
    return k.op("add", [k.op("mul", [mm, alpha], dt), k.op("mul", [bias, beta], dt)], dt)


# --- freezing: a parameter's weight packed once for MKL's GEMM ----------------------------

# Eager's Linear (``addmm(b, x, w.t())``, ``mm`` without a bias; HF's Conv1D: ``addmm(b, x,
# w)`` with ``w`` stored K x N) has MKL repack the weight into its blocked layout on every
# call. With options={"freezing": True}, an inference graph at fixed sizes calls
# ``mkl::_mkl_linear`` instead, with the weight packed for its row count by a cache that
# packs it again when the weight changes (runtime/packed_weights.py), where that is measured
# faster at compile time: both calls timed on example tensors of the node's layouts,
# interleaved, the best of a few each, once per process per shape and thread count. Why
# measured: the gain is 5-30% at transformer sizes, and a loss at some (2 rows, 768 x 768).
PACKED_GAIN = 1.02     # the margin by which packed must win (a near tie is noise)
_packing_seconds: dict = {}    # key -> (plain, packed) best seconds


def _packed_linear(ctx, node, x, b, bias, x_node, bias_node=None):
    """``x @ b (+ bias)`` as ``mkl::_mkl_linear`` with the weight packed, where ``b`` is a
    weight matrix ``ctx.options.pack_weights`` allows (a parameter of an inference graph at
    fixed sizes: lower/core.py LowerOptions) read transposed (Linear's N x K weight) or as
    it is (a K x N weight), all fp32, the bias a vector, and packed is measured faster;
    else None (the plain extern)."""
    if not ctx.options.pack_weights or b.strided is None:
        return None
    w, strides, offset = b.strided
    m, k = x.sizes
    n = b.sizes[1]
    if not (w.kind == "input" and w.input_index in ctx.options.pack_weights and offset == 0):
        return None
    if tuple(w.sizes) == (n, k) and tuple(w.strides) == (k, 1) and tuple(strides) == (1, k):
        stored_kn = False                 # nn.Linear: x @ w.t()
    elif tuple(w.sizes) == (k, n) and tuple(w.strides) == (n, 1) and tuple(strides) == (n, 1):
        stored_kn = True                  # HF's Conv1D (GPT-2): x @ w
    else:
        return None
    out, x_meta = node.meta.get("traced_meta"), x_node.meta.get("traced_meta")
    bias_meta = bias_node.meta.get("traced_meta") if bias_node is not None else None
    if out is None or x_meta is None or (bias is not None and (bias_meta is None or tuple(bias.sizes) != (n,))):
        return None
    if any(v.dtype != torch.float32 for v in (x, b) + ((bias,) if bias is not None else ())) \
            or tuple(out.stride) != (n, 1) or out.offset != 0 or m == 0 or n == 0 \
            or not torch.backends.mkl.is_available():
        return None
    if not _packing_faster(x_meta, bias_meta, n, k, stored_kn):
        return None
    # _mkl_linear reads the weight as N x K (its sizes; and all of it where it runs linear
    # instead: a weight the cache could not pack); x and the bias in their traced layouts,
    # as the plain extern has them (ctx.extern)
    weight_nk = LoopValue.view_of(w, (n, k), (1, n), 0) if stored_kn else LoopValue.of_buffer(w)
    return ctx.extern(node, (x, PackedWeight(w.input_index, m, stored_kn), weight_nk, bias, m), {},
                      fallback=False, op=torch.ops.mkl._mkl_linear.default,
                      arg_nodes=(x_node, None, None, bias_node, None))


def _packing_faster(x_meta, bias_meta, n, k, stored_kn) -> bool:
    """Is ``_mkl_linear`` with a packed weight PACKED_GAIN times faster than eager's
    ``addmm``/``mm`` on tensors of these layouts? Timed once per process and key."""
    key = (tuple(x_meta.shape), tuple(x_meta.stride), bias_meta is not None, n, k, stored_kn,
           torch.get_num_threads())
    if key not in _packing_seconds:
        with torch.no_grad():
            x = _example(x_meta)
            g = example_generator()
            w_nk = torch.randn(k, n, generator=g).t() if stored_kn else torch.randn(n, k, generator=g)
            b = _example(bias_meta) if bias_meta is not None else None
            m = x.shape[0]
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w_nk.contiguous(), m)
            mkl_linear = torch.ops.mkl._mkl_linear.default
            wt = w_nk.t()                 # eager's operand: a view (Linear) or the K x N weight
            plain = (lambda: torch.addmm(b, x, wt)) if b is not None else (lambda: torch.mm(x, wt))
            _packing_seconds[key] = _best_interleaved(plain, lambda: mkl_linear(x, packed, w_nk, b, m))
    plain_s, packed_s = _packing_seconds[key]
    return packed_s * PACKED_GAIN < plain_s


def _best_interleaved(f, g, budget_s=0.05):
    """The best times of ``f`` and ``g`` over alternating calls: 3 each, more for fast ones
    (up to ``budget_s`` of timing each, 15 at most). On one thread by the thread's CPU time,
    which other processes' load does not inflate; else by the wall clock."""
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    best_f = best_g = float("inf")
    f(), g()
    reps = r = 0
    while r < max(reps, 3):
        t0 = clock()
        f()
        t1 = clock()
        g()
        t2 = clock()
        best_f, best_g = min(best_f, t1 - t0), min(best_g, t2 - t1)
        if r == 0:
            reps = min(15, int(budget_s / max(t1 - t0, 1e-6)))
        r += 1
    return best_f, best_g


EXTERN_OPS = [aten.convolution.default, aten.convolution_backward.default,
              aten._scaled_dot_product_flash_attention_for_cpu.default,
              aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
              aten.baddbmm.default, aten.embedding_dense_backward.default]


# --- convolutions: eager's layouts, or contiguous where that is measured faster ------------

# An extern runs with the layouts eager had (ctx.extern: ATen picks output layouts from its
# inputs', and we index outputs as traced). Some of those layouts take slow library paths:
# ConvNeXt's 7x7 depthwise convolution backward at 768 channels on 4x4 takes 23 ms with its
# channels-last input (the layout the downsampling convolution leaves) and 1.3 ms with
# contiguous arguments, while at 96 channels on 32x32 channels-last is the faster (3.2 against
# 7.9 ms). So a CPU convolution site with a non-contiguous tensor argument is timed both ways
# at compile time (the copies to contiguous and back to the traced layouts included) and
# runs contiguous where that is at least CONTIGUOUS_GAIN times faster: the margin keeps a
# noisy timing on a loaded machine from flipping a near tie.
CONTIGUOUS_GAIN = 1.25
_CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)


def lower_extern(ctx, node, args, kwargs):
    """An EXTERN_OPS node as a library call (convolutions in the layout measured faster; a
    depthwise convolution's weight gradient as loops, lower/depthwise.py)."""
    lowered = depthwise_backward(ctx, node, args, kwargs)
    if lowered is not None:
        return lowered
    if node.target in _CONVOLUTIONS:
        strides = _contiguous_strides_if_faster(ctx, node)
        if strides is not None:
            return ctx.extern(node, args, kwargs, fallback=False, out_strides=strides)
    return ctx.extern(node, args, kwargs, fallback=False)


def example_generator() -> torch.Generator:
    """The random numbers of compile-time timing's example tensors: a generator of their
    own, so that compiling never moves the user's RNG (after a compiled first call
    ``torch.randn`` must draw what it draws after eager's)."""
    return torch.Generator().manual_seed(0)


def _example(tm):
    """A tensor of ``tm``'s sizes, strides and dtype with normal values, for timing."""
    return torch.empty_strided(tm.shape, tm.stride, dtype=tm.dtype).normal_(
        generator=example_generator())


def _best_seconds(fn, reps=3):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _contiguous_strides_if_faster(ctx, node):
    """The output strides of ``node`` called with contiguous tensor arguments, when that call
    (with its copies) is measured CONTIGUOUS_GAIN times faster than eager's layouts; else
    None. Shape-generic graphs keep eager's layouts (a measured choice is one size's)."""
    if ctx.options.size_choices is not None:
        return None
    metas = fx.node.map_arg(node.args, lambda n: n.meta.get("traced_meta"))
    tensor_metas = [m for m in metas if m is not None and hasattr(m, "stride")]
    if not tensor_metas or any(m.device is None or m.device.type != "cpu" or not m.dtype.is_floating_point
                               for m in tensor_metas):
        return None
    if all(tuple(m.stride) == tuple(contiguous_strides(m.shape)) for m in tensor_metas):
        return None
    traced = node.meta.get("traced_meta")
    outs_meta = [traced] if traced is not None else _output_metas(node)
    with torch.no_grad():
        eager_args = [(_example(m) if m is not None and hasattr(m, "stride") else a)
                      for m, a in zip(metas, node.args)]
        contig_args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in eager_args]
        op = node.target
        result = op(*contig_args)
        results = [result] if traced is not None else list(result)
        if len(results) < len(outs_meta):
            return None

        def as_traced(outs):
            for o, m in zip(outs, outs_meta):
                if m is not None and o is not None and tuple(o.stride()) != tuple(m.stride):
                    torch.empty_strided(m.shape, m.stride, dtype=m.dtype).copy_(o)

        def contiguous_call():
            out = op(*[a.contiguous() if isinstance(a, torch.Tensor) else a for a in eager_args])
            as_traced([out] if traced is not None else out)
        eager_s = _best_seconds(lambda: op(*eager_args))
        contig_s = _best_seconds(contiguous_call)
    if contig_s * CONTIGUOUS_GAIN > eager_s:
        return None
    return [tuple(o.stride()) if o is not None else None for o in results[:len(outs_meta)]]


def _output_metas(node):
    from .core import _multi_metas
    return _multi_metas(node)
