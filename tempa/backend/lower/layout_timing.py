"""The measured convolution layout (config.cpu_conv_layout = "measured", the CPU's default):
an inference graph runs its convolutions channels-last where they, with the conversions
that layout adds, are measured faster than in eager's layouts.

Why: oneDNN's depthwise convolutions are several times faster on NHWC than on NCHW
activations (MobileNetV2 b2 128x128, one thread: its first stride-2 depthwise convolution
1083 us NCHW, 366 us NHWC; all its convolutions 13.4 -> 8.9 ms a call; Inductor's layout
optimization makes CPU conv nets channels-last), while a dense 3x3 convolution on few channels can be
slower NHWC, and each channels-last convolution of an NCHW caller pays for converting its
weight on every call (no freezing) and for the first input and the returned tensors. Which
wins depends on the net, the sizes and the machine, so it is timed at compile time rather
than guessed: every convolution of the eager-layout graph against its counterpart in the
channels-last replay (interleaved, the best of a few calls each, by the thread's CPU time
on one thread), plus the channels-last graph's conversions, each on example tensors of
the traced layouts. The generated kernels between convolutions are not timed: they run in
whichever layout their inputs have at about the same cost (the C++ target stores values
between channels-last convolutions channels-last: CppTarget.channels_last_stores).
Channels-last must win by MEASURED_GAIN: the margin keeps a near tie, where the untimed
kernels decide, in eager's layouts."""
from __future__ import annotations

import torch
import torch.fx as fx

from .matmul import _best_interleaved, _example

aten = torch.ops.aten

MEASURED_GAIN = 1.05
_seconds: dict = {}         # key -> (eager, channels-last) best seconds of one pair


def _is_conv(n) -> bool:
    return n.op == "call_function" and n.target is aten.convolution.default


def _is_conversion(n) -> bool:
    """A copy the channels-last replay added: an argument made channels-last (clone with a
    memory format) or a returned tensor given eager's strides back (copy into empty_strided)."""
    if n.op != "call_function":
        return False
    if n.target is aten.clone.default:
        return n.kwargs.get("memory_format") is torch.channels_last
    if n.target is aten.copy.default and isinstance(n.args[0], fx.Node):
        return n.args[0].target is aten.empty_strided.default
    return False


def _meta_key(tm):
    return (tuple(tm.shape), tuple(tm.stride), tm.dtype) if tm is not None and hasattr(tm, "stride") else None


def _call_of(n):
    """``n`` as a call on example tensors of its traced layouts; (callable, key) or None."""
    metas = fx.node.map_arg(n.args, lambda a: a.meta.get("traced_meta"))
    kwargs = fx.node.map_arg(n.kwargs, lambda a: a.meta.get("traced_meta"))
    if any(isinstance(a, fx.Node) and not hasattr(m, "stride") for a, m in zip(n.args, metas)):
        return None
    if n.target is aten.copy.default:        # into new memory of the destination's strides
        dst, src = metas[0], metas[1]
        if dst is None or src is None:
            return None
        s = _example(src)
        return (lambda: torch.empty_strided(dst.shape, dst.stride, dtype=dst.dtype).copy_(s),
                ("copy", _meta_key(dst), _meta_key(src)))
    args = [_example(m) if isinstance(a, fx.Node) else a for a, m in zip(n.args, metas)]
    if any(isinstance(v, fx.Node) for v in kwargs.values()):
        return None
    op = n.target
    key = (str(op), tuple(_meta_key(m) if isinstance(a, fx.Node) else repr(a) for a, m in zip(n.args, metas)),
           repr(sorted(n.kwargs.items(), key=lambda kv: kv[0])))
    return (lambda: op(*args, **n.kwargs)), key


def _time_pair(f, g, budget_s=0.05):
    """The best seconds of ``f`` and ``g``, timed interleaved (matmul._best_interleaved);
    tests put fixed timings here."""
    return _best_interleaved(f, g, budget_s)


def channels_last_faster(eager_gm: fx.GraphModule, cl_gm: fx.GraphModule) -> tuple[bool, float, float]:
    """Are ``cl_gm``'s convolutions and conversions MEASURED_GAIN times faster than
    ``eager_gm``'s convolutions? (the answer, eager seconds, channels-last seconds)"""
    eager_convs = [n for n in eager_gm.graph.nodes if _is_conv(n)]
    cl_convs = [n for n in cl_gm.graph.nodes if _is_conv(n)]
    extra = [n for n in cl_gm.graph.nodes if _is_conversion(n)]
    if len(eager_convs) != len(cl_convs):
        return False, float("nan"), float("nan")
    threads = torch.get_num_threads()
    eager_s = cl_s = 0.0
    with torch.no_grad():
        pairs = list(zip(eager_convs, cl_convs)) + [(None, n) for n in extra]
        for e, c in pairs:
            ce = _call_of(e) if e is not None else ((lambda: None), None)
            cc = _call_of(c)
            if ce is None or cc is None:
                return False, float("nan"), float("nan")
            key = (ce[1], cc[1], threads)
            if key not in _seconds:
                _seconds[key] = _time_pair(ce[0], cc[0], budget_s=0.02)
            a, b = _seconds[key]
            eager_s += a if e is not None else 0.0
            cl_s += b
    return cl_s * MEASURED_GAIN < eager_s, eager_s, cl_s

