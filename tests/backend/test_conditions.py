"""Conditions of piecewise values (cat, constant_pad_nd, slice_scatter, select_scatter) are
data (``index.Cond``), rendered by each emitter with its own spelling of an index: C++ with
``IndexExpr.c()`` (integer ``/`` on non-negative indices), Triton with ``TritonEmitter.ix``
(``//``). Before, lowerings wrote C++ condition strings and the Triton emitter rewrote them
with a regular expression (``) / 3)`` -> ``) // 3)``), the one place left where a backend
reparsed another's output (issue 17)."""
import os

import pytest
import torch
import torch.nn.functional as F

import tempa
from tempa.backend.codegen.triton_emit import TritonEmitter
from tempa.backend.index import Cond, IndexExpr, Var

try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False


def _cond():
    x0 = IndexExpr.of(Var("x0", 24))
    return Cond.within(x0.floordiv(3), 1, 7) & Cond.compare(x0 - 2, "==", 0, modulus=4)


def test_the_cpp_and_triton_spellings_of_one_condition():
    cond = _cond()
    assert cond.c() == "(((x0) / 3)) >= 1 && (((x0) / 3)) < 7 && ((x0 - 2) % 4) == 0"
    triton_parts = cond.parts(TritonEmitter(two_d=False).ix)
    assert triton_parts == ["(((x0) // 3)) >= 1", "(((x0) // 3)) < 7", "((x0 - 2) % 4) == 0"]
    assert Cond().always and Cond().c() == "true"


interp = pytest.mark.skipif(not HAVE_TRITON or torch.cuda.is_available()
                            or os.environ.get("TRITON_INTERPRET") != "1",
                            reason="CPU-only check through Triton's interpreter")


def _pad_of_a_split_dim(x):
    # the pad's bounds test an index of a reshaped value: a floor division in the condition
    return F.pad(x.reshape(4, 6).t().reshape(3, 8), (2, 1)) * 3


def _slice_scatter_with_step(base, src):
    return torch.slice_scatter(base, src, dim=1, start=1, end=9, step=2) + 1


def _select_scatter(base, src):
    return torch.select_scatter(base, src, 1, 2) * 2


CASES = {
    "pad_of_a_split_dim": (_pad_of_a_split_dim, (torch.randn(24),)),
    "slice_scatter_with_step": (_slice_scatter_with_step, (torch.randn(3, 10), torch.randn(3, 4))),
    "select_scatter": (_select_scatter, (torch.randn(3, 5), torch.randn(3))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpp_piecewise_values_equal_eager(name):
    fn, args = CASES[name]
    compiled = tempa.compile(fn)
    torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)
    info = tempa.entries(compiled)[0].compiled.tempa_info
    assert info.kernel_count >= 1 and not info.fallback_reason and not info.aten_fallbacks


@interp
@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_piecewise_values_equal_eager(name):
    from tempa.backend.gpu import gpu_backend
    fn, args = CASES[name]
    compiled = tempa.compile(fn, backend=lambda gm, ex: gpu_backend(gm, ex))
    torch.testing.assert_close(compiled(*args), fn(*args), rtol=0, atol=0)
    info = tempa.entries(compiled)[0].compiled.tempa_info
    assert info.kernel_count >= 1 and not info.fallback_reason and not info.aten_fallbacks
