"""options={"freezing": True}: CPU inference graphs run a Linear whose weight is a parameter
as MKL's GEMM with the weight packed once (lower/matmul.py _packed_linear), packed again when
the weight changes (runtime/packed_weights.py). Where the packed call is used is a timing
choice, forced here (PACKED_GAIN 0: always; inf: never) except where the timing is tested.
Each test checks which call the wrapper makes, so it fails with the feature switched off."""
import logging

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.lower import matmul
from tempa.backend.runtime.packed_weights import PackedWeightCache

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(),
                                reason="MKL's packed GEMM (mkl::_mkl_linear)")
MKL_LINEAR = "mkl._mkl_linear.default"


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


@pytest.fixture
def always_pack(monkeypatch):
    monkeypatch.setattr(matmul, "PACKED_GAIN", 0.0)


def _inference(compiled):
    """The inference variant's CompiledGraphInfo of ``compiled``'s one graph."""
    (entry,) = tempa.entries(compiled)
    return entry.kernels.inference


def _packs(compiled):
    return [c.packs for c in _inference(compiled).packed_weights]


def _same(got, want, m, k, n, bias):
    """Bit-identical where MKL's packed call is to eager's GEMM on this machine at this shape
    (checked on the raw calls: it depends on K's blocking), else equal to fp32 tolerance."""
    if _mkl_bit_identical(m, k, n, bias):
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def _mkl_bit_identical(m, k, n, bias):
    torch.manual_seed(1)
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n) if bias else None
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
    plain = torch.addmm(b, x, w.t()) if bias else torch.mm(x, w.t())
    return torch.equal(torch.ops.mkl._mkl_linear(x, packed, w, b, m), plain)


@pytest.mark.parametrize("shape, k, n, bias", [
    ((130,), 768, 3072, True), ((2, 65), 3072, 768, True), ((64,), 512, 256, False),
    ((4, 50), 300, 700, True), ((2,), 768, 768, True), ((2,), 768, 768, False)])
def test_packed_linear_matches_eager(always_pack, shape, k, n, bias):
    torch.manual_seed(0)
    m = nn.Linear(k, n, bias=bias)
    x = torch.randn(*shape, k)
    c = tempa.compile(m, options={"freezing": True})
    with torch.no_grad():
        got1, got2, want = c(x), c(x), m(x)
    info = _inference(c)
    assert MKL_LINEAR in info.extern_calls and "_mkl_linear" in info.wrapper_source
    assert _packs(c) == [1]                    # packed once, on the first call
    rows = x.numel() // k
    assert _same(got1, want, rows, k, n, bias) and torch.equal(got1, got2)


class Conv1D(nn.Module):
    """HF's GPT-2 projection: the weight stored K x N, ``addmm(bias, x, w)``."""

    def __init__(self, k, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, n) * 0.02)
        self.bias = nn.Parameter(torch.randn(n))

    def forward(self, x):
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(x.shape[:-1] + (self.weight.shape[1],))


@pytest.mark.parametrize("k, n", [(768, 2304), (3072, 768)])
def test_weight_stored_k_by_n_is_packed_from_its_transpose(always_pack, k, n):
    torch.manual_seed(0)
    m = Conv1D(k, n)
    x = torch.randn(2, 65, k)
    c = tempa.compile(m, options={"freezing": True})
    with torch.no_grad():
        got, want = c(x), m(x)
        assert _same(got, want, 130, k, n, True)
        m.weight.mul_(-1)
        assert torch.allclose(c(x), m(x), rtol=1e-5, atol=1e-5)
    info = _inference(c)
    assert info.extern_calls == [MKL_LINEAR] and _packs(c) == [2]
    cache = PackedWeightCache(0, 8, stored_kn=True)   # unpackable: passed as it is
    wide = torch.randn(k, n, dtype=torch.float64)
    assert cache(wide) is wide


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 128, bias=False))


def test_weight_changes_are_seen_and_repacked(always_pack):
    m = _mlp()
    x = torch.randn(64, 256)
    c = tempa.compile(m, options={"freezing": True})

    def check(packs):
        with torch.no_grad():
            got, want = c(x), m(x)
        assert _packs(c) == packs
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    check([1, 1])
    check([1, 1])                                       # unchanged: no packing
    opt = torch.optim.SGD(m.parameters(), lr=0.1)       # an optimizer step (eager)
    m(x).square().mean().backward()
    opt.step()
    check([2, 2])
    other = _mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-2)
    m.load_state_dict(other.state_dict())               # load_state_dict
    check([3, 3])
    with torch.no_grad():                               # an in-place update under no_grad
        m[2].weight.add_(1)
    check([3, 4])
    opt.zero_grad()
    m(x).sum().backward()                               # a foreach (multi-tensor) Adam step
    torch.optim.Adam(m.parameters(), lr=0.01, foreach=True).step()
    check([4, 5])


def test_a_new_parameter_object_is_seen(always_pack):
    m = _mlp()
    x = torch.randn(64, 256)
    c = tempa.compile(m, options={"freezing": True})
    with torch.no_grad():
        c(x)
        m[0].weight = nn.Parameter(torch.randn(512, 256))
        got, want = c(x), m(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert all(_packs_of(e) for e in tempa.entries(c))   # every graph that ran packed its weights


def _packs_of(entry):
    return [p.packs for p in entry.kernels.inference.packed_weights]


def test_cache_repacks_for_another_tensor_pointer_or_layout():
    """The per-call check itself: identity, version, data pointer, sizes, strides, dtype."""
    w = nn.Parameter(torch.randn(96, 64))
    cache = PackedWeightCache(0, 32)
    first = cache(w)
    assert first.is_mkldnn and cache(w) is first and cache.packs == 1
    w.data = torch.randn(96, 64)                 # same object and version, new memory
    second = cache(w)
    assert second is not first and cache.packs == 2
    w.data.add_(1)                               # not seen (the contract): .data's own counter
    assert cache(w) is second and cache.packs == 2
    alias = w.data                               # same memory and metadata, version 0: another
    assert cache(alias) is not second and cache.packs == 3   # tensor, so packed again
    assert torch.equal(torch.ops.mkl._mkl_linear(torch.ones(32, 64), cache(alias), alias, None, 32),
                       torch.ones(32, 64) @ alias.t())
    cache(w)
    assert cache.packs == 4
    w.data = w.data.reshape(64, 96)              # same memory, other sizes and strides
    cache(w)
    assert cache.packs == 5
    with torch.no_grad():
        w.add_(1)                                # a version bump
    cache(w)
    assert cache.packs == 6
    w.data = w.data.double()                     # other dtype: cannot be packed, passed as is
    assert cache(w) is w and cache.packs == 6
    bits = nn.Parameter(torch.randn(96, 64), requires_grad=False)
    cache(bits)
    bits.data = bits.data.view(torch.int32)      # same memory, sizes, strides; other dtype
    assert cache(bits) is bits and cache.packs == 7
    with torch.inference_mode():                 # no version counter: passed as is
        frozen = torch.randn(96, 64)
    assert cache(frozen) is frozen and cache(frozen) is frozen and cache.packs == 7


def test_option_off_calls_eagers_gemm_and_on_calls_mkl_linear(always_pack):
    x = torch.randn(64, 256)
    paths = {}
    for freezing in (None, False, True):
        tempa.reset()
        m = _mlp()
        c = tempa.compile(m, options=None if freezing is None else {"freezing": freezing})
        with torch.no_grad():
            got, want = c(x), m(x)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
        info = _inference(c)
        paths[freezing] = (sorted(info.extern_calls), len(info.packed_weights))
        assert ("torch.addmm" in info.wrapper_source) == (not freezing)
    assert paths[None] == paths[False] == (["aten.addmm.default", "aten.mm.default"], 0)
    assert paths[True] == ([MKL_LINEAR, MKL_LINEAR], 2)


def test_timing_decides(monkeypatch):
    """Without forcing, the choice is timed once per shape (both calls run); never packed
    where packed must win by an infinite margin."""
    monkeypatch.setattr(matmul, "_packing_seconds", {})
    x = torch.randn(64, 256)
    c = tempa.compile(_mlp(), options={"freezing": True})
    with torch.no_grad():
        c(x)
    timed = matmul._packing_seconds
    assert len(timed) == 2 and all(a > 0 and b > 0 for a, b in timed.values())
    expected = sum(plain > packed * matmul.PACKED_GAIN for plain, packed in timed.values())
    assert len(_inference(c).packed_weights) == expected
    tempa.reset()
    monkeypatch.setattr(matmul, "PACKED_GAIN", float("inf"))
    c = tempa.compile(_mlp(), options={"freezing": True})
    with torch.no_grad():
        c(x)
    assert _inference(c).packed_weights == [] and MKL_LINEAR not in _inference(c).extern_calls


def test_training_is_unchanged_and_never_packs(always_pack):
    x = torch.randn(64, 256)
    sources = {}
    for freezing in (False, True):
        tempa.reset()
        m = _mlp()
        ref = _mlp()
        c = tempa.compile(m, options={"freezing": freezing})
        c(x).square().mean().backward()
        ref(x).square().mean().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        (entry,) = tempa.entries(c)
        fw, bw = entry.kernels.forward, entry.kernels.backward
        assert entry.kernels.inference is None
        assert MKL_LINEAR not in fw.extern_calls + bw.extern_calls
        sources[freezing] = (fw.wrapper_source, bw.wrapper_source)
        with torch.no_grad():                    # inference: packs where the option is on
            c(x)
        (inference,) = [e.kernels.inference for e in tempa.entries(c) if e.kernels.inference]
        assert len(inference.packed_weights) == (2 if freezing else 0)
    assert sources[False] == sources[True]


def test_shape_generic_graphs_never_pack(always_pack):
    m = _mlp()
    static = tempa.compile(m, options={"freezing": True})
    with torch.no_grad():
        static(torch.randn(64, 256))
    assert len(_inference(static).packed_weights) == 2      # the same graph at fixed sizes does
    tempa.reset()
    c = tempa.compile(m, dynamic=True, options={"freezing": True})
    with torch.no_grad():
        for rows in (64, 80):
            x = torch.randn(rows, 256)
            assert torch.allclose(c(x), m(x), rtol=1e-5, atol=1e-5)
    for e in tempa.entries(c):
        assert MKL_LINEAR not in (e.kernels.inference.extern_calls or [])
        assert "mkl" not in e.kernels.inference.wrapper_source


@pytest.mark.parametrize("value", [1, 0, "true", None, "freezing"])
def test_bad_option_values_are_refused(value):
    with pytest.raises(ValueError, match="option 'freezing' must be one of True, False"):
        tempa.compile(_mlp(), options={"freezing": value})
    with pytest.raises(ValueError, match="freezing: True or False"):
        tempa.compile(_mlp(), options={"freezeing": True})


def test_packed_count_and_contract_are_said(always_pack, caplog):
    x = torch.randn(64, 256)
    c = tempa.compile(_mlp(), options={"freezing": True})
    with caplog.at_level(logging.INFO, logger="tempa.perf"), torch.no_grad():
        c(x)
    line = "freezing: 2 weights packed; in-place changes through .data are not seen"
    assert any(line in r.getMessage() for r in caplog.records)
    (entry,) = tempa.entries(c)
    assert line in entry.kernels.notes
    assert "freezing: 2 weights packed" in str(tempa.explain(c)(x))
    assert "freezing" not in str(tempa.explain(tempa.compile(_mlp()))(x))
