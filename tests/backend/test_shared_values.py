"""A value read by several users that reads two or more buffers is stored once on the CPU
(CppTarget.shared_reads, lower/lowerings.py lower_graph). Why: a pre-LayerNorm transformer's
residual stream is a chain of adds, each cheap, so the inlining cost rule alone recomputes
layer i's residual sum from all 2i earlier sublayer outputs in each pass of layer i's
LayerNorm; with it stored, every LayerNorm reads one residual buffer, as eager's does."""
import re

import torch
import torch.nn.functional as F

from .helpers import compile_fn

LAYERS, D = 6, 64


def _pre_norm_stack(x, w):
    # each "sublayer" is a LayerNorm, then a matmul (an extern: its result is a buffer)
    for i in range(LAYERS):
        x = x + F.layer_norm(x, (D,)) @ w[i]
    return F.layer_norm(x, (D,))


def _most_buffers_one_segment_reads(src: str) -> int:
    signatures = re.findall(r'extern "C" int \w+\(([^)]*)\)', src)
    return max(len(re.findall(r"const float\*", s)) for s in signatures)


def test_the_residual_stream_is_stored_once_not_recomputed_by_each_layer_norm():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, D, generator=g), torch.randn(LAYERS, D, D, generator=g) * 0.1
    c = compile_fn(_pre_norm_stack, x, w)
    # stored: a LayerNorm segment reads the last residual and the last matmul's output;
    # recomputed, the final LayerNorm read x and all six matmul outputs
    assert _most_buffers_one_segment_reads(c.tempa_info.cpp_source) <= 3
    ref = _pre_norm_stack(x.double(), w.double())
    assert torch.allclose(c(x, w).double(), ref, rtol=1e-5, atol=1e-5)
