"""Saved values leave a CPU training forward in the layout the forward has them in, and the
backward is compiled for those layouts (autograd.py _own_layout_outputs). What must not
change with that: a saved value that is a view of a user output stays tied to it, so an
in-place write to the output before the backward raises eager's error; and a saved
transposed view of the forward's own memory gives eager's gradient."""
import pytest
import torch

import tempa


def setup_function():
    tempa.reset()


def _view_of_output(x):
    y = x * 2
    return y, y.t().sin()          # sin saves its input: a view of the returned y


def test_writing_an_output_whose_view_was_saved_raises_as_in_eager():
    for fn in (_view_of_output, tempa.compile(_view_of_output)):
        x = torch.randn(3, 4, requires_grad=True)
        y, s = fn(x)
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            s.sum().backward()


def test_a_saved_transposed_view_of_the_forwards_memory_gives_eagers_gradient():
    def f(x, w):
        h = torch.tanh(x @ w)       # computed in the forward's own memory
        return (h.t().sin() * h.t()).sum()   # sin and mul save the transposed view
    torch.manual_seed(0)
    x, w = torch.randn(64, 32), torch.randn(32, 48)
    grads = []
    for fn in (f, tempa.compile(f)):
        xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        fn(xs, ws).backward()
        grads.append((xs.grad, ws.grad))
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert tempa.stats().eager_fallbacks == 0


def test_a_saved_value_a_convolution_gradient_reads_keeps_eagers_layout(monkeypatch):
    """A channels-last net whose first convolution runs on contiguous arguments (chosen so):
    the GELU between the convolutions comes out contiguous, eager's is channels-last. Its
    value is saved for the second convolution's backward, whose gradient ATen lays out like
    that input and the backward indexes as traced: so it is saved in eager's layout. (Saved
    in the forward's own, the gradients came out wrong by up to 6.)"""
    from tempa.backend.lower import matmul
    monkeypatch.setattr(matmul, "CONTIGUOUS_GAIN", 0.0)

    def net(x, w1, b1, w2):
        F = torch.nn.functional
        return F.conv2d(F.gelu(F.conv2d(x, w1, b1, padding=3, groups=8)), w2).square().mean()
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    ws = [torch.randn(8, 1, 7, 7, requires_grad=True), torch.randn(8, requires_grad=True),
          torch.randn(4, 8, 1, 1, requires_grad=True)]
    tempa.compile(net)(x, *ws).backward()
    got = [t.grad for t in (x, *ws)]
    for t in (x, *ws):
        t.grad = None
    net(x, *ws).backward()
    for a, t in zip(got, (x, *ws)):
        torch.testing.assert_close(a, t.grad, rtol=1e-4, atol=1e-4)
