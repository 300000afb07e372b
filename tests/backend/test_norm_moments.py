"""The moments of a LayerNorm and a GroupNorm are accumulated in float on the CPU, as
eager's kernels do (ATen's RowwiseMoments), with the shift correction that keeps a large
mean from cancelling (lower/reductions.py _var); a user's own var/std keeps eager's double
accumulator. Why float: a double accumulator halves the vector width of the three row
passes (the zoo's LayerNorm and GroupNorm ran 0.83x and 0.86x of the float version)."""
import pytest
import torch
import torch.nn.functional as F

from .helpers import compile_fn


def _relative_error(v, ref):
    return ((v.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("mean,std,n", [(0, 1, 64), (1e3, 1, 768), (1e4, 0.1, 768), (1e5, 0.1, 256),
                                        (0, 1, 4096)])
def test_layer_norm_in_float_is_as_accurate_as_eager(mean, std, n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, n, generator=g) * std + mean
    w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    c = compile_fn(lambda x, w, b: F.layer_norm(x, (n,), w, b), x, w, b)
    src = c.tempa_info.cpp_source
    assert "float acc_" in src and "double acc_" not in src
    ref = F.layer_norm(x.double(), (n,), w.double(), b.double())
    eager = _relative_error(F.layer_norm(x, (n,), w, b), ref)
    assert _relative_error(c(x, w, b), ref) <= max(2 * eager, 1e-6)


def test_group_norm_in_float_is_as_accurate_as_eager():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 16, 16, generator=g) * 0.5 + 1e3
    w, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    c = compile_fn(lambda x, w, b: F.group_norm(x, 4, w, b), x, w, b)
    assert "double acc_" not in c.tempa_info.cpp_source
    ref = F.group_norm(x.double(), 4, w.double(), b.double())
    eager = _relative_error(F.group_norm(x, 4, w, b), ref)
    assert _relative_error(c(x, w, b), ref) <= max(2 * eager, 1e-6)


def test_a_users_var_keeps_the_double_accumulator():
    x = torch.randn(4, 256) * 0.1 + 1e5
    c = compile_fn(lambda x: x.var(-1), x)
    assert "double acc_" in c.tempa_info.cpp_source
    ref = x.double().var(-1)
    assert _relative_error(c(x), ref) <= max(100 * _relative_error(x.var(-1), ref), 1e-7)


def test_a_long_row_keeps_the_double_accumulator():
    x = torch.randn(2, 8192)
    c = compile_fn(lambda x: F.layer_norm(x, (8192,)), x)
    assert "double acc_" in c.tempa_info.cpp_source


def test_the_shift_and_square_sums_share_one_row_loop():
    # codegen/cpp.py _sibling_reductions: the two sums read the mean, not each other
    x, w, b = torch.randn(6, 64), torch.randn(64), torch.randn(64)
    c = compile_fn(lambda x, w, b: F.layer_norm(x + 1, (64,), w, b), x, w, b)
    src = c.tempa_info.cpp_source
    fused = [l for l in src.splitlines() if "#pragma omp simd" in l and l.count("reduction(+:acc_") == 2]
    assert len(fused) == 1, src
    torch.testing.assert_close(c(x, w, b), F.layer_norm(x + 1, (64,), w, b))


def test_a_sum_that_reads_another_keeps_its_own_loop():
    # softmax: the sum of exp(x - max) reads the max, so the two stay apart
    x = torch.randn(5, 33)
    c = compile_fn(lambda x: torch.softmax(x, -1), x)
    src = c.tempa_info.cpp_source
    assert not any(l.count("reduction(") > 2 for l in src.splitlines() if "#pragma omp" in l)
    torch.testing.assert_close(c(x), torch.softmax(x, -1))
