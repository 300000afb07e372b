"""The decomposition table: which ATen ops are rewritten into simpler ATen ops before lowering.

Why these: the loop IR covers pointwise ops, reductions and views, so composite ops that are
*made of* those (layer/batch/group norm, softmax, gelu, their backwards) are decomposed and
then fuse like any other chain. Ops that are better as one library call (matmul,
convolution, attention, embedding's backward scatter) are kept whole. Scans (cumsum,
cumprod) are not listed: the reference decomposition sums an n x n masked copy of the input
(O(n^2) memory and time: 14 GB for a 60000-element cumsum), ATen's kernel is one pass.
"""
from __future__ import annotations

import functools

import torch
from torch._decomp import decomposition_table

aten = torch.ops.aten

_EXTRA = [
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.native_batch_norm, aten.native_batch_norm_backward,
    aten._native_batch_norm_legit, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training,
    aten.native_group_norm, aten.native_group_norm_backward,
    aten.gelu, aten.gelu_backward, aten.silu, aten.silu_backward, aten.sigmoid_backward,
    aten.tanh_backward, aten.hardtanh, aten.hardtanh_backward, aten.leaky_relu,
    aten.leaky_relu_backward, aten.mse_loss, aten.mse_loss_backward, aten.elu, aten.elu_backward,
    aten.hardsigmoid, aten.hardswish, aten.hardswish_backward,
    aten.mish, aten.softplus, aten.softplus_backward,
    aten.logsumexp, aten.std, aten.std_mean, aten.addcmul, aten.addcdiv, aten.lerp,
    aten.masked_fill, aten.norm, aten.linalg_vector_norm,
    # composite-explicit ops that commonly reach the dispatcher
    aten.stack, aten.rsub, aten.nll_loss_forward, aten.binary_cross_entropy,
    aten.binary_cross_entropy_backward, aten.smooth_l1_loss, aten.huber_loss, aten.logit,
    aten.log_sigmoid_forward, aten.log_sigmoid_backward, aten.clamp_min, aten.clamp_max,
    aten.hardshrink, aten.softshrink, aten.glu, aten.celu, aten.selu, aten.select_backward,
    aten.slice_backward, aten.native_dropout_backward, aten._reshape_alias, aten.squeeze_copy,
    aten.diag_embed, aten.xlogy, aten.special_xlog1py, aten.expand_as, aten.trace, aten.frac,
    aten.deg2rad, aten.rad2deg, aten.sinc, aten.logaddexp, aten.logaddexp2, aten.hypot,
    aten.nan_to_num, aten.heaviside, aten.copysign, aten.sgn, aten.square, aten.fmin, aten.fmax,
    aten.addmv, aten.addr, aten.aminmax, aten.count_nonzero, aten.nansum,
    aten.linspace, aten.logspace, aten.eye, aten.diagonal_backward, aten._log_softmax_backward_data,
    aten.threshold, aten.renorm, aten.dist, aten.cosine_similarity, aten.pdist,
    aten.unsafe_split, aten.unsafe_chunk, aten.split_with_sizes_copy, aten.take,
    aten.index_add, aten.index_copy, aten.masked_scatter, aten.rot90, aten.vdot, aten.dot,
    aten.mv, aten.outer, aten.ger, aten.isneginf, aten.isposinf, aten.isinf, aten.signbit,
    aten.mvlgamma, aten.soft_margin_loss, aten.margin_ranking_loss, aten.l1_loss,
    aten.hinge_embedding_loss, aten.kl_div, aten.poisson_nll_loss, aten.triplet_margin_loss,
    aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle, aten.im2col, aten.col2im,
    aten.upsample_nearest2d, aten.upsample_bilinear2d, aten._adaptive_avg_pool2d,
    aten.avg_pool2d, aten.reflection_pad2d, aten.replication_pad2d, aten.tril, aten.triu,
    aten.repeat, aten.roll, aten.flip, aten.floor_divide, aten.remainder,
]

# Kept whole: lowered directly (as reductions or extern calls) or better as one ATen call.
_KEEP = [
    aten.var, aten.var_mean, aten.amax, aten.amin, aten.mm, aten.addmm, aten.bmm,
    aten.embedding, aten.embedding_dense_backward, aten.convolution,
    aten.convolution_backward, aten.native_dropout, aten.argmax, aten.argmin,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten.sum, aten.mean, aten.prod, aten.index_select, aten.gather, aten.cat,
    aten.constant_pad_nd, aten.clone, aten.slice_scatter, aten.select_scatter,
    aten.index, aten.where, aten.clamp, aten.copy, aten.arange, aten.full, aten.expand,
    aten.squeeze, aten.unsqueeze, aten.split, aten.split_with_sizes, aten.unbind, aten.t,
    aten.transpose, aten.permute, aten.view, aten._unsafe_view, aten.select, aten.slice,
    aten.rsub, aten.sub, aten.add, aten.mul, aten.div, aten.pow, aten.maximum, aten.minimum,
    aten.max, aten.min, aten.any, aten.all, aten.alias, aten.detach, aten.baddbmm,
    aten.fill, aten.zeros_like,
    aten.ones_like, aten.full_like, aten.empty_like, aten.new_zeros, aten.new_ones,
    aten.new_full, aten.new_empty, aten.sigmoid, aten.relu, aten.threshold_backward, aten.expm1,
    aten.log1p, aten.isnan, aten.abs, aten.sign,
]


# Foreach ops (torch.optim's foreach steps): one op per tensor of the lists, each then fusing
# with the other ops on the same tensor (the loop IR has no list values). It is what ATen's
# CPU kernels do (the "slow path": ``at::add(self[i], other[i], alpha)`` per tensor): list
# arguments, scalar lists included, go item by item, the others to every call. Left out:
# addcmul/addcdiv with their scalars in a tensor (read with .item()), maximum/minimum (the
# per-tensor op takes no scalar).
_FOREACH = ["add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "pow", "sqrt", "rsqrt",
            "neg", "reciprocal", "abs", "exp", "sign", "sigmoid", "clamp_min", "clamp_max"]


# The foreach op's scalar argument that the per-tensor op takes by keyword only.
_KEYWORD_SCALAR = {"addcmul": "value", "addcdiv": "value"}


def _per_tensor(op, keyword=None):
    def run(*args, **kwargs):
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        if keyword is not None and len(args) == 4:
            *args, kwargs[keyword] = args

        def item(a, i):
            return a[i] if isinstance(a, (list, tuple)) else a
        return [op(*(item(a, i) for a in args), **{k: item(v, i) for k, v in kwargs.items()})
                for i in range(n)]
    return run


def _foreach_table() -> dict:
    dec = {}
    for name in _FOREACH:
        packet = getattr(aten, f"_foreach_{name}")
        for overload in packet.overloads():
            if overload.endswith("out") or (overload == "Tensor" and name in ("addcmul", "addcdiv")):
                continue
            dec[getattr(packet, overload)] = _per_tensor(getattr(aten, name), _KEYWORD_SCALAR.get(name))
    return dec


# 1/6 as ATen's hardsigmoid_backward kernels write it, ``scalar_t(1.0f / 6.0f)``: rounded to
# float32 first, also for float64 (the reference decomposition's 1.0 / 6.0 differs there in
# the last bits from eager's gradient).
_ONE_SIXTH_AS_ATEN = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))


def _hardsigmoid_backward(grad_output, self):
    inside = (self > -3.0) & (self < 3.0)
    return torch.where(inside, grad_output * _ONE_SIXTH_AS_ATEN, 0.0)


# Ops decomposed here rather than by torch._decomp's reference, to give eager's bits.
_OWN = {aten.hardsigmoid_backward.default: _hardsigmoid_backward}


@functools.lru_cache(None)
def table() -> dict:
    dec = _foreach_table()
    for op in _EXTRA:
        for name in op.overloads():
            ov = getattr(op, name)
            if ov in decomposition_table:
                dec[ov] = decomposition_table[ov]
    dec.update(_OWN)
    for op in _KEEP:
        for name in op.overloads():
            dec.pop(getattr(op, name), None)
    return dec
