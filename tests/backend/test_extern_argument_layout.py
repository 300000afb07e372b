"""A tensor argument of an ATen call made from the wrapper (an extern: matmul, attention, an
op tempa runs as ATen) has the strides it had when traced (lower/core.py LowerCtx.extern):
ATen picks some outputs' layouts from their inputs' strides, and the wrapper reads each
output with the traced strides.

Two ways this went wrong:
- an argument traced at a nonzero storage offset (a slice of a computed value) was stored
  contiguous: `sort`'s output then came back in another layout than traced, and the
  compiled function returned wrong values (max error 21.6 on a 6x5 result);
- a view of a matmul's output that differed from the traced layout only in a size-1 dim's
  stride (a batch-1 attention's q/k/v: lowering's view gives such a dim stride 0, ATen the
  next dim's extent) was copied into new memory before the call: every BERT layer copied
  q, k and v before attention at batch 1.
"""
import re

import pytest
import torch
import torch.nn.functional as F

import tempa


def _wrapper(compiled) -> str:
    (entry,) = tempa.entries(compiled)
    return entry.kernels.inference.passes["wrap"]


def test_an_offset_argument_keeps_its_traced_strides():
    def f(a):
        y = (a * 2).t()[1:]            # a computed value, traced at offset 1, strides (1, 7)
        return torch.sort(y, dim=0)[0] * 3 + 1   # sort's output follows its input's strides
    tempa.reset()
    a = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    c = tempa.compile(f)
    got, want = c(a), f(a)
    assert "aten.sort" in " ".join(tempa.entries(c)[0].kernels.inference.aten_fallbacks)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want)


def test_batch_one_attention_reads_the_projections_in_place():
    torch.manual_seed(0)
    q_proj, k_proj, v_proj = (torch.nn.Linear(64, 64) for _ in range(3))

    def attention(x):
        b, t, _ = x.shape
        q = q_proj(x).view(b, t, 4, 16).transpose(1, 2)
        k = k_proj(x).view(b, t, 4, 16).transpose(1, 2)
        v = v_proj(x).view(b, t, 4, 16).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v)

    tempa.reset()
    x = torch.randn(1, 256, 64)       # 256 tokens: the projections run as ATen GEMMs
    c = tempa.compile(attention)
    with torch.no_grad():
        got, want = c(x), attention(x)
    wrapper = _wrapper(c)
    assert wrapper.count("torch.addmm") + wrapper.count("_o0(") >= 3, wrapper
    # q, k and v are views of the GEMMs' outputs: no C++ copy, no new buffer before attention
    assert "_S" not in wrapper.split("_o1(")[0].split("def call")[1], wrapper
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_linear_weight_reaches_its_gemm_as_a_transposed_view():
    # an input matrix's transpose is ``t()`` in the wrapper, one cheap view call, where
    # ``as_strided`` parsed three lists on every call (the zoo's hf_bert x1.08 a call)
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 128)
    tempa.reset()
    c = tempa.compile(lin)
    x = torch.randn(512, 256)
    with torch.no_grad():
        torch.testing.assert_close(c(x), lin(x))
    wrapper = _wrapper(c)
    assert re.search(r"\ba\d+\.t\(\)", wrapper), wrapper
    assert "_as_strided(a" not in wrapper, wrapper


@pytest.mark.parametrize("n", [16, 768])
def test_a_value_stored_in_memory_order_reaches_a_gemm_in_either_layout(n):
    # sin(x.t()) keeps x.t()'s strides, so it is computed in memory order and allocated as
    # that transposed view; g.t() is then its memory as computed. The wrapper handed the
    # allocated view instead: a shape error at n=16, and at n=768 (square) the transpose of
    # the right product, silently (max error 129)
    def f(x, w1, w2):
        g = torch.sin(x.t())
        return g @ w1, g.t() @ w2
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(768, n), torch.randn(768, 300), torch.randn(n, 200)
    tempa.reset()
    with torch.no_grad():
        got, want = tempa.compile(f)(x, w1, w2), f(x, w1, w2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
