"""Vectorised math in the generated C++ (codegen/prelude.py): libmvec's exp/log/... through
our ``simd`` declarations and the NaN-propagating max/min reductions, checked against torch
on ordinary and special values (inf, NaN, denormals, overflow and underflow), and checked to
be vectorised (the library imports libmvec's 8-wide functions)."""
import struct

import pytest
import torch

from tempa.backend.codegen import prelude as pre

from .helpers import compile_fn

AVX2 = "avx2" in open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else False


def _values(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    special = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 88.0, 88.8, 89.0,
               -87.0, -103.0, -104.0, -150.0, 1e-45, -1e-45, 1e-38, 1.2e-38, 3.4e38, -3.4e38,
               0.5, 2.0, 1e-7, -1e-7, 700.0, -745.0, 710.0]
    spread = torch.cat([torch.randn(4000, generator=g) * s for s in (1, 10, 40)])
    dense = torch.linspace(-110, 90, 5003)
    return torch.cat([torch.tensor(special), spread, dense]).to(dtype)


def _ulps(a, b):
    """Distance in units in the last place (float32), treating NaN == NaN and inf == inf."""
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    spacing = torch.nextafter(b.float(), torch.tensor(float("inf"))).double() - b
    d = ((a - b).abs() / spacing.abs().clamp_min(1e-45)).nan_to_num(nan=float("inf"), posinf=float("inf"))
    return torch.where(same, torch.zeros_like(d), d)


def _imports(fn, sym):
    so = fn.tempa_info.inference.so_path
    return sym.encode() in open(so, "rb").read()


FUNCS = [("exp", torch.exp), ("log", torch.log), ("sin", torch.sin), ("cos", torch.cos),
         ("tanh", torch.tanh), ("erf", torch.erf), ("expm1", torch.expm1), ("log1p", torch.log1p)]


@pytest.mark.parametrize("name,op", FUNCS, ids=[f[0] for f in FUNCS])
def test_unary_math_matches_torch_on_special_values(name, op):
    x = _values()
    if name in ("sin", "cos"):
        x = x[x.abs() < 1e4]          # large-argument reduction: both are right, differently
    c = compile_fn(lambda t: op(t) * 1.0, x)
    out, ref = c(x), op(x)
    assert (out.isnan() == ref.isnan()).all()
    assert (out.isinf() == ref.isinf()).all() and (out[out.isinf()] == ref[ref.isinf()]).all()
    u = _ulps(out, ref)
    assert u.max().item() <= 4, (name, x[u.argmax()].item(), out[u.argmax()].item(), ref[u.argmax()].item())
    fin = ref.isfinite() & (ref.abs() > 1e-30)
    rel = ((out - ref).abs() / ref.abs())[fin]
    assert rel.max().item() < 1e-6


def test_exp_double_matches_torch():
    x = _values(torch.float64) * 8
    c = compile_fn(lambda t: torch.exp(t), x)
    out, ref = c(x), torch.exp(x)
    assert torch.allclose(out, ref, rtol=1e-14, atol=0, equal_nan=True)


@pytest.mark.skipif(not (pre.mvec_functions() and AVX2), reason="needs libmvec and AVX2")
def test_exp_in_softmax_rows_is_vectorised():
    x = torch.randn(64, 96)
    c = compile_fn(lambda t: torch.softmax(t * 0.5, -1), x)
    assert torch.allclose(c(x), torch.softmax(x * 0.5, -1), rtol=1e-5, atol=1e-7)
    # gcc picks the widest vector exp the machine has: AVX2's 8 lanes or AVX-512's 16.
    assert _imports(c, "_ZGVdN8v_expf") or _imports(c, "_ZGVeN16v_expf"), c.tempa_info.cpp_source


def test_max_reduction_propagates_nan_and_handles_inf():
    x = torch.randn(37, 53)
    x[3, 7] = float("nan")
    x[5, :] = float("-inf")
    x[6, 10] = float("inf")
    x[8, :] = float("nan")
    x[9, 52] = float("nan")           # last element: the vector loop's tail
    x[10, 0] = float("nan")
    for op in (lambda t: t.amax(-1), lambda t: t.amin(-1), lambda t: t.amax(0),
               lambda t: torch.max(t, -1).values, lambda t: t.amax()):
        c = compile_fn(op, x)
        out, ref = c(x), op(x)
        assert torch.equal(out.isnan(), ref.isnan())
        assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref))


def test_max_reduction_int_and_double():
    xi = torch.randint(-1000, 1000, (9, 70))
    xd = torch.randn(9, 70, dtype=torch.float64)
    xd[2, 3] = float("nan")
    for x in (xi, xd):
        for op in (lambda t: t.amax(-1), lambda t: t.amin(-1)):
            c = compile_fn(op, x)
            out, ref = c(x), op(x)
            assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref)), (out, ref)
            assert torch.equal(out.isnan(), ref.isnan())


def test_maximum_and_clamp_propagate_nan():
    a = torch.tensor([1.0, float("nan"), 3.0, -float("inf"), 0.0] * 7)
    b = torch.tensor([float("nan"), 2.0, 1.0, 0.0, -0.0] * 7)
    for op in (lambda p, q: torch.maximum(p, q), lambda p, q: torch.minimum(p, q),
               lambda p, q: torch.clamp(p, min=0.5) + q):
        c = compile_fn(op, a, b)
        out, ref = c(a, b), op(a, b)
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref))


def test_embedding_out_of_range_still_raises():
    w = torch.randn(10, 16)
    idx = torch.tensor([[1, 2, 5], [3, 9, 0]])
    c = compile_fn(lambda i, t: torch.nn.functional.embedding(i, t) * 2, idx, w)
    assert torch.equal(c(idx, w), torch.nn.functional.embedding(idx, w) * 2)
    with pytest.raises(IndexError):
        c(torch.tensor([[1, 2, 10], [3, 9, 0]]), w)


def test_safe_softmax_is_lowered_and_zeroes_masked_rows():
    """SDPA's math decomposition emits _safe_softmax: lowered with its mask, no fallback."""
    q, k = torch.randn(2, 3, 8, 16), torch.randn(2, 3, 8, 16)
    mask = torch.zeros(8, 8).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf"))
    mask[2, :] = float("-inf")         # a fully masked row: _safe_softmax gives 0 there

    def f(q, k):
        return torch.ops.aten._safe_softmax(q @ k.transpose(-1, -2) * 0.25 + mask, -1)
    c = compile_fn(f, q, k)
    out, ref = c(q, k), f(q, k)
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-7) and (out[:, :, 2] == 0).all()
    assert not c.tempa_info.aten_fallbacks, c.tempa_info.aten_fallbacks
    x = torch.randn(4, 9)
    x[1, :] = float("-inf")
    x[2, 3] = float("nan")
    x[3, :4] = float("-inf")
    c = compile_fn(lambda t: torch.ops.aten._safe_softmax(t * 1.0, -1), x)
    out, ref = c(x), torch.ops.aten._safe_softmax(x, -1)
    assert torch.allclose(out, ref, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert not c.tempa_info.aten_fallbacks and c.tempa_info.kernel_count == 1
