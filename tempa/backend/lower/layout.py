"""The convolution layout policy: which convolutions a traced graph runs channels-last, and
the stride conversions that keep what the caller sees in eager's layouts (used by the
replays of replay.py and joint.py)."""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


# Where 4-D convolutions run: "eager" (the layouts eager gives them) or "channels_last"
# (NHWC: the input and weight of each convolution converted where they are not already).
# Why: cuDNN's bf16/fp16 tensor-core convolutions work in NHWC, so an NCHW convolution pays
# transposes inside cuDNN (forward and both backward ones); Inductor's layout optimization
# runs CUDA convolutions channels-last too. The conversion is an op in the traced graph, so
# the traced metas of what follows a convolution (eager's TensorIterator keeps the layout
# of its inputs) are channels-last: the pointwise kernels between convolutions read and
# write NHWC and no extra copy is made, and a weight is converted in the kernel that casts
# it to bf16 under autocast. What the user sees keeps eager's layout: each returned tensor
# gets the strides the eager-layout trace gave it, each gradient its input's layout (as
# AccumulateGrad gives .grad), and a mutated input is written in its own strides (the
# copy-back). The target chooses (config.gpu_conv_layout, config.cpu_conv_layout); a
# shape-generic graph keeps eager's layouts. A grouped convolution with several channels
# per group keeps its layout (cuDNN's NHWC grouped kernels are slow; Inductor skips such
# graphs too); depthwise ones convert.
CONV_LAYOUTS = ("eager", "channels_last")


def _wants_channels_last(n) -> bool:
    """Is ``n`` a 4-D convolution whose input or weight is not channels-last yet?"""
    if n.op != "call_function" or n.target is not aten.convolution.default or len(n.args) < 9:
        return False
    x, w = (a.meta.get("traced_meta") if isinstance(a, fx.Node) else None for a in n.args[:2])
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    groups, transposed = n.args[8], n.args[6]
    per_group = w.shape[0] // groups if transposed else w.shape[1]
    if groups > 1 and per_group > 1:
        return False
    return not (is_channels_last(x) and is_channels_last(w))


def is_channels_last(tm) -> bool:
    """Is the traced value ``tm`` (a TracedMeta of a 4-D tensor) laid out channels-last?"""
    return torch.empty_strided(tm.shape, tm.stride, device="meta").is_contiguous(
        memory_format=torch.channels_last)


def converts_convolutions(gm: fx.GraphModule) -> int:
    """How many convolutions of the functional graph ``gm`` the channels-last policy converts."""
    return sum(_wants_channels_last(n) for n in gm.graph.nodes)


def _in_traced_layout(t, node):
    """``t`` with the strides ``node`` was traced with (eager's), copied where they differ."""
    tm = node.meta.get("traced_meta") if isinstance(node, fx.Node) else None
    if not isinstance(t, torch.Tensor) or tm is None or tuple(t.stride()) == tuple(tm.stride):
        return t
    return _Restrided.apply(t, tuple(tm.stride))


def _grad_in_input_layout(g, inp):
    """The gradient ``g`` of ``inp`` in the layout AccumulateGrad gives ``.grad``: ``inp``'s
    strides where it is dense, else contiguous."""
    if g is None:
        return g
    want = tuple(inp.stride()) if _dense(inp.shape, inp.stride()) else tuple(_contiguous(inp.shape))
    return g if tuple(g.stride()) == want else _restrided(g, want)


def _dense(shape, stride) -> bool:
    """Do these strides cover one block of memory once, in some order of the dims?"""
    expected = 1
    for st, size in sorted((st, size) for size, st in zip(shape, stride) if size != 1):
        if st != expected:
            return False
        expected *= size
    return True


def _contiguous(shape) -> tuple:
    return torch.empty(shape, device="meta").stride()


def _restrided(t, stride):
    """``t`` copied into memory of exactly ``stride`` (size-1 dims included): ATen's
    functional copy keeps its destination's strides, and lowers to one kernel writing them."""
    return aten.copy.default(torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device), t)


class _Restrided(torch.autograd.Function):
    """``_restrided`` with its gradient passed through (aten.copy has no derivative)."""

    @staticmethod
    def forward(ctx, t, stride):
        return _restrided(t, stride)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _channels_last_backward(grad, inp, weight, *rest, **kwargs):
    """convolution_backward with a channels-last gradient where its input is channels-last
    (cuDNN would transpose the gradient itself); the decomposition the channels-last joint
    trace records the backward with."""
    if grad.dim() == 4 and inp.dim() == 4 and inp.is_contiguous(memory_format=torch.channels_last) \
            and not grad.is_contiguous(memory_format=torch.channels_last):
        return aten.convolution_backward.default(grad.contiguous(memory_format=torch.channels_last),
                                                 inp, weight, *rest, **kwargs)
    return NotImplemented


_CHANNELS_LAST_BACKWARD = {aten.convolution_backward.default: _channels_last_backward}
