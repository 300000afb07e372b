"""Column reductions in the C++ code: a sum over the rows of a row-major value, one result per
column (bias and LayerNorm weight gradients sum over the tokens), runs with the kept dim
innermost in blocks, an accumulator array per result (codegen/cpp.py ``_column_block``),
instead of a reduction loop that reads one column with the row's stride. Checked against
eager (float32 and float64) and on the generated C++."""
import copy
import re

import pytest
import torch
import torch.nn as nn

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _sources(fast):
    out = []
    for e in tempa.entries(fast):
        info = e.compiled.tempa_info
        for gi in (info.inference, info.forward, info.backward):
            if gi is not None:
                out.append(gi.cpp_source)
    return "\n".join(out)


def _blocked(src):
    """The accumulator arrays of column-blocked kernels: {buffer: block size}."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"acc_(\w+)\[(\d+)\];", src)}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_column_sums_run_with_the_kept_dim_innermost(dtype, tol):
    def f(x, w):
        return (x * w).sum(0), x.sum(0), (x * x).amax(0), x.amin(0)

    torch.manual_seed(0)
    x, w = torch.randn(250, 512, dtype=dtype), torch.randn(250, 1, dtype=dtype)
    x[3, 7] = float("nan")                         # max/min propagate NaN as eager does
    fast = tempa.compile(f)
    for got, want in zip(fast(x, w), f(x, w)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * 250, equal_nan=True)
    src = _sources(fast)
    assert {v for k, v in _blocked(src).items()} == {64} and \
        sum(1 for k in _blocked(src) if not k.startswith("part")) == 4, src
    # the rows, in 10 chunks of 25 each summed apart, sit outside the block's columns, which
    # read contiguously
    assert re.search(r"for \(int64_t r_\w+l = 0; r_\w+l < 25;[^}]*#pragma omp simd\s*\n\s*for "
                     r"\(int64_t x0i = 0; x0i < 64;", src), src
    if dtype == torch.float32:              # rounding like eager's (against float64)
        exact = f(x.double(), w.double())
        for got, want, ref in zip(fast(x, w)[:2], f(x, w)[:2], exact[:2]):
            err = lambda a: (a.double() - ref).abs().nan_to_num().max()   # noqa: E731 (the NaN column)
            assert err(got) <= 2 * err(want)


def test_only_column_sums_are_blocked():
    """Row sums read their rows contiguously, and a centred sum reads the mean computed in
    its own loop nest (which exists only after all rows): both keep the row loop."""
    def f(x, y):
        m = y.mean(0)
        return x.sum(0), x.sum(-1), ((y - m) ** 2).sum(0)

    torch.manual_seed(0)
    x, y = torch.randn(64, 96), torch.randn(64, 80)
    fast = tempa.compile(f)
    for got, want in zip(fast(x, y), f(x, y)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    src = _sources(fast)
    kernels = [k for k in src.split("// kernel")[1:]]
    blocked = [k for k in kernels if "x0i" in k]
    # x.sum(0): 96 columns in 2 blocks of 48; the centred sum's 80 would be blocks of 40
    assert len(blocked) == 1 and "[48];" in blocked[0] and "[40];" not in src, src


def test_a_column_dim_without_a_divisor_up_to_64_is_left_alone_and_a_small_one_is_one_block():
    torch.manual_seed(0)
    for cols, block in ((257, None), (40, 40), (100, 50)):
        x = torch.randn(30, cols)
        fast = tempa.compile(lambda x: x.sum(0))
        torch.testing.assert_close(fast(x), x.sum(0), rtol=1e-5, atol=1e-5)
        blocked = set(_blocked(_sources(fast)).values())
        assert blocked == ({block} if block else set()), (cols, blocked)
        tempa.reset()


def test_layernorm_and_bias_gradients_equal_eagers():
    """A pre-LN block's backward: LayerNorm weight and bias gradients and the Linear biases'
    sum over the tokens, in column blocks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128))
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    x = torch.randn(2, 50, 128)
    fast(x).pow(2).mean().backward()
    eager(x).pow(2).mean().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    bw = tempa.entries(fast)[0].compiled.tempa_info.backward
    assert len(_blocked(bw.cpp_source)) >= 4, bw.cpp_source      # ln weight, ln bias, 2 biases
