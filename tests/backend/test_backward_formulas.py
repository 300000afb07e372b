"""Training graphs whose recorded backward needs care, compiled rather than run as eager ATen
calls, with eager's gradients (float64 reference):

- ops whose decomposition ends in prims ops autograd has no formula for (flip's prims.rev,
  fmin's prims.fmin, ...) differentiated through their own derivative
  (lower/joint.py KEEP_WHOLE_FOR_AUTOGRAD);
- a derivative formula that writes in place into a tensor of its own (fmin's
  ``logical_or_``, a ``copy_`` into fresh zeros), recorded as the out-of-place op
  (lower/trace.py _functional_in_backward);
- an ``as_strided`` that is a reshape of a contiguous value, replayed as a view
  (lower/replay.py _is_reshape)."""
from __future__ import annotations

import warnings

import pytest
import torch

import tempa


def _compiled_backward(compiled):
    info = [e.compiled.tempa_info for e in tempa.entries(compiled)][0]
    return info.backward is not None and info.fallback_reason is None


@pytest.mark.parametrize("name,fn", [
    ("flip", lambda a, b: (a * b).flip(1)),
    ("hypot", lambda a, b: torch.hypot(a, b)),
    ("fmin", lambda a, b: torch.fmin(a, b * 2)),
    ("fmax", lambda a, b: torch.fmax(a, b * 2)),
    ("remainder", lambda a, b: torch.remainder(a * 3, b.abs() + 1)),
    ("copysign", lambda a, b: torch.copysign(a * 2, b)),
])
def test_backward_compiled_with_eager_gradients(name, fn):
    tempa.reset()
    torch.manual_seed(5)
    a = torch.randn(6, 7, requires_grad=True)
    b = torch.randn(6, 7, requires_grad=True)
    ar, br = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    g = torch.randn(6, 7)
    compiled = tempa.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # no "running it eagerly"
        compiled(a, b).backward(g)
    fn(ar, br).backward(g.double())
    torch.testing.assert_close(a.grad.double(), ar.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad.double(), br.grad, rtol=1e-5, atol=1e-6)
    assert _compiled_backward(compiled), name


def test_as_strided_reshape_gradient_is_compiled():
    """An ``as_strided`` that is a reshape of a contiguous value (a GroupNorm decomposition
    flattens its statistics so) is replayed as a view (lower/replay.py _is_reshape): its
    gradient needs no copy_, so the backward is compiled, and equals eager's."""
    tempa.reset()
    torch.manual_seed(4)

    def f(x, w):
        y = (x * w).sin()                                   # a computed, contiguous value
        flat = y.as_strided((x.shape[0], x[0].numel()), (x[0].numel(), 1))
        return (flat * flat.sum(1, keepdim=True)).sum(1)

    x = torch.randn(3, 4, 5, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    compiled = tempa.compile(f)
    compiled(x, w).sum().backward()
    f(xr, wr).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), wr.grad, rtol=1e-5, atol=1e-6)
    assert _compiled_backward(compiled)
