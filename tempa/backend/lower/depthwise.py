"""A depthwise convolution's weight and bias gradients as loops (the C++ target).

Why: oneDNN's backward-weights for a depthwise convolution (one filter per channel) with a
large filter (ConvNeXt's 7x7, EfficientNet's 5x5) runs at about 2 GFLOP/s on one thread: ConvNeXt-T
b2 128x128, 96 channels on 32x32: 9.9 ms for the weight gradient against 1.1 ms for the
input gradient, two thirds of its convolution time in a training step, in eager and in
torch.compile alike (both call ATen). Each weight-gradient element is a sum over the batch
and the output pixels of the output gradient times the input pixel under that filter tap:
a plain reduction, here over a zero-padded copy of the input (no test per tap). The input gradient
stays ATen's call (its output_mask asks for that one alone).

Only for filters of LOOP_MIN_TAPS taps or more. Measured (one thread, forward and backward
of one convolution, b2): 7x7 at 96 and 768 channels on 32x32 and 4x4 4.0x and 2.5x faster
than eager, 5x5 at 240 channels on 16x16 2.4x; 3x3 at 32-960 channels 0.81-0.96x: ATen's
3x3 kernel is fast, and these loops do not beat it.
"""
from __future__ import annotations

import torch.fx as fx

from ..index import Cond, IndexExpr, contiguous_strides
from ..ir import LoopValue
from .core import aten
from .reductions import long_sum_accumulator

_BACKWARD = aten.convolution_backward.default
LOOP_MIN_TAPS = 25      # 5x5 filters and larger (above)


def _depthwise_2d(node: fx.Node) -> bool:
    """Is ``node`` the backward of a 2-D depthwise convolution (groups == channels, one
    filter each) in floating point, with LOOP_MIN_TAPS taps or more, whose weight gradient
    is asked for?"""
    if node.target is not _BACKWARD or len(node.args) < 11:
        return False
    grad, inp, weight = (a.meta.get("traced_meta") if isinstance(a, fx.Node) else None for a in node.args[:3])
    transposed, groups, mask = node.args[7], node.args[9], node.args[10]
    if grad is None or inp is None or weight is None or transposed or not mask[1]:
        return False
    if len(inp.shape) != 4 or len(weight.shape) != 4 or not inp.dtype.is_floating_point:
        return False
    channels = inp.shape[1]
    return groups == channels > 1 and tuple(weight.shape[:2]) == (channels, 1) \
        and weight.shape[2] * weight.shape[3] >= LOOP_MIN_TAPS


def _contiguous(node: fx.Node) -> bool:
    tm = node.meta.get("traced_meta")
    return tm is not None and tuple(tm.stride) == contiguous_strides(tm.shape)


def _rows_contiguous(ctx, value: LoopValue, node: fx.Node, origin: str) -> LoopValue:
    """``value`` where its traced layout is contiguous, else a contiguous copy of it."""
    if _contiguous(node):
        return value
    return ctx.realize(LoopValue(value.sizes, value.dtype, value.load), origin)


def _padded(ctx, inp: LoopValue, node: fx.Node, padding, origin: str) -> LoopValue:
    """The input with its padding as zeros, contiguous: every filter tap is then read without
    a test. Why: the per-element test of a tap in the padding kept the loops from
    vectorizing (a 3x3 filter took longer than a 5x5); the copy is one pass over the input."""
    ph, pw = padding
    if not ph and not pw:
        return _rows_contiguous(ctx, inp, node, origin)
    n, c, h, w = inp.sizes

    def load(k, idx):
        b, ch, y, x = idx
        src = [b, ch, IndexExpr.of(y) - ph, IndexExpr.of(x) - pw]
        inside = Cond.within(src[2], 0, h) & Cond.within(src[3], 0, w)
        return k.piecewise([(inside, lambda k: inp.load(k, src)),
                            (Cond(), lambda k: k.const(0, inp.dtype))], inp.dtype)
    return ctx.realize(LoopValue((n, c, h + 2 * ph, w + 2 * pw), inp.dtype, load), origin)


def _pair(v) -> list:
    v = [int(x) for x in v]
    return v * 2 if len(v) == 1 else v


def depthwise_backward(ctx, node: fx.Node, args, kwargs):
    """The lowered (grad_input, grad_weight, grad_bias) of ``node``, or None where it is not
    a depthwise convolution's backward this lowering covers."""
    if not ctx.options.depthwise_weight_grad_loops or kwargs or not _depthwise_2d(node):
        return None
    grad, inp, weight = args[:3]
    if not all(isinstance(v, LoopValue) for v in (grad, inp, weight)) or not ctx.options.admits(inp.dtype):
        return None
    # ATen takes one value for both dims as well (EfficientNet's convolutions pass [2])
    stride, padding, dilation = (_pair(v) for v in args[4:7])
    mask = args[10]
    # the loops run along a row of pixels: a channels-last input or gradient is read from a
    # contiguous copy (ConvNeXt's 96 channels on 32x32: 8.7 ms read in place, against
    # 4.2 ms for ATen's channels-last backward), the input with its padding
    grad_rows = _rows_contiguous(ctx, grad, node.args[0], "depthwise weight gradient")
    inp_padded = _padded(ctx, inp, node.args[1], padding, "depthwise weight gradient")
    n, c, oh, ow = grad.sizes
    kh, kw = weight.sizes[2:]
    dt = node.args[2].meta["traced_meta"].dtype      # the weight's, as its gradient's
    acc = long_sum_accumulator(ctx, dt, n * oh * ow)

    def weight_grad(k, idx, ridx):
        ch, tap_h, tap_w = idx[0], idx[2], idx[3]
        b, y, x = ridx
        # in the padded input: the output size's formula keeps every tap inside it
        ih = IndexExpr.of(y) * stride[0] + IndexExpr.of(tap_h) * dilation[0]
        iw = IndexExpr.of(x) * stride[1] + IndexExpr.of(tap_w) * dilation[1]
        g = k.cast(grad_rows.load(k, [b, ch, y, x]), acc)
        return k.op("mul", [g, k.cast(inp_padded.load(k, [b, ch, ih, iw]), acc)], acc)
    grad_weight = ctx.reduction((c, 1, kh, kw), (n, oh, ow), "sum", weight_grad, dt, acc,
                                "convolution_backward(depthwise weight)")
    grad_bias = None
    if mask[2]:
        def bias_grad(k, idx, ridx):
            b, y, x = ridx
            return k.cast(grad_rows.load(k, [b, idx[0], y, x]), acc)
        grad_bias = ctx.reduction((c,), (n, oh, ow), "sum", bias_grad, dt, acc,
                                  "convolution_backward(depthwise bias)")
    grad_input = None
    if mask[0]:
        grad_input = ctx.extern(node, tuple(args[:10]) + ([True, False, False],), kwargs,
                                fallback=False, keep_outputs=(0,))[0]
    return grad_input, grad_weight, grad_bias
