"""Fusion across reshapes (schedule.py): a member's dim may span several outer dims, and the
outer space is refined when a candidate splits it more finely."""
import torch
import torch.nn.functional as F

import tempa

from tempa.backend.schedule import common_outer, fits

from .helpers import close, compile_fn


def test_fits_and_common_outer():
    assert fits((2, 16), (32, 64)) and fits((2, 16), (2, 16, 1)) and fits((32,), (2, 16, 64)) is False
    assert fits((2, 16), (2, 1, 16, 8)) and not fits((2, 16), (4, 8)) and not fits((2, 16), (2,))
    assert common_outer((8, 16, 16), (2, 4, 16, 1)) == (2, 4, 16)
    assert common_outer((32,), (2, 16, 64)) == (2, 16)
    assert common_outer((2, 16), (32, 64)) == (2, 16)
    assert common_outer((6, 4), (4, 6)) is None
    assert common_outer((3,), (5, 3)) is None


def test_layer_norm_then_flattened_matmul_is_one_kernel():
    B, T, C = 2, 16, 64
    x, w, b = torch.randn(B, T, C), torch.randn(C), torch.randn(C)
    W = torch.randn(C, 96)

    def f(x, W):
        h = F.layer_norm(x, (C,), w, b)
        return h.view(B * T, C) @ W
    c = compile_fn(f, x, W)
    assert close(c(x, W), f(x, W), atol=1e-4, rtol=1e-4)
    info = c.tempa_info
    # stats (mean, var) and the normalised GEMM input in one loop nest, the stats in registers
    assert info.kernel_count == 1, info.fusion_report
    assert "iteration spaces differ" not in info.fusion_report, info.fusion_report


def test_softmax_over_heads_fuses_with_merged_batch_scores():
    B, H, T, D = 2, 4, 16, 8
    q, k, v = (torch.randn(B * H, T, D) for _ in range(3))
    mask = torch.ones(T, T).tril()

    def f(q, k, v):
        s = torch.bmm(q, k.transpose(1, 2)).view(B, H, T, T) * 0.3
        s = s.masked_fill(mask == 0, float("-inf"))
        p = torch.softmax(s, -1).view(B * H, T, T)
        return torch.bmm(p, v)
    c = compile_fn(f, q, k, v)
    assert close(c(q, k, v), f(q, k, v), atol=1e-5, rtol=1e-5)
    rep = c.tempa_info.fusion_report
    # the scores, their max and sum and the normalised probabilities share one nest over (B, H, T)
    assert "kernel over [2, 4, 16]" in rep and "iteration spaces differ" not in rep, rep


def test_refined_outer_keeps_reads_local_and_correct():
    # a row reduction over a reshaped producer whose rows cross the old outer split
    x = torch.randn(6, 8, 5)

    def f(x):
        y = x * 2 + 1
        s = y.view(3, 2, 8, 5).sum(-1, keepdim=True)
        return (y.view(3, 2, 8, 5) - s).view(6, 40).amax(-1)
    c = compile_fn(f, x)
    assert close(c(x), f(x))


def test_extern_argument_is_computed_once_for_its_transpose():
    """A backward's dY feeds dY @ W and dY.t() @ X: once made memory for the first matmul,
    the transpose is a strided view of that buffer, not a second (transposed) computation."""
    a, W, X = torch.randn(32, 256), torch.randn(256, 64), torch.randn(32, 48)

    def f(a, W, X):
        dy = torch.tanh(a) * 0.5 + a
        return dy @ W, dy.t() @ X
    c = compile_fn(f, a, W, X)
    assert close(c(a, W, X), f(a, W, X), atol=1e-4, rtol=1e-4)
    assert c.tempa_info.kernel_count == 1, c.tempa_info.fusion_report


def test_batchnorm_parameters_flattened_by_its_decomposition_are_views():
    """flatten (BatchNorm's decomposition flattens its weight and bias when they require
    grad, as a module's parameters do under no_grad) is a view like reshape, not one ATen call
    per parameter."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU6()).eval()
    x = torch.randn(1, 3, 8, 8)
    tempa.reset()
    with torch.no_grad():
        assert close(tempa.compile(m)(x), m(x))
    s = tempa.stats()
    assert s.graphs_compiled == 1 and s.kernels_compiled >= 1 and s.aten_fallbacks == 0, s


def test_flattened_input_returned_is_a_view_of_it():
    x = torch.randn(2, 3, 4)

    def f(x):
        return torch.flatten(x, 1), torch.flatten(x, 1) * 2
    c = compile_fn(f, x)
    out, ref = c(x), f(x)
    assert close(out, ref)
    assert out[0].data_ptr() == x.data_ptr() and out[0]._base is x
