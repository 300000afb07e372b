"""Convolutions run with eager's layouts, or with contiguous arguments where that is measured
faster at compile time (lower/matmul.py: ConvNeXt's depthwise backward on channels-last input
is 18x slower than contiguous at 768 channels on 4x4). Either way the values are eager's and
so are the layouts of what the graph returns. The choice is forced here both ways (timings
decide it otherwise)."""
import pytest
import torch
import torch.nn.functional as F

from tempa.backend.lower import matmul

from .helpers import close, compile_fn


def _depthwise_then_pointwise(x, w_dw, b_dw, w_pw):
    h = F.conv2d(x, w_dw, b_dw, padding=3, groups=x.shape[1])
    return F.conv2d(F.gelu(h), w_pw).square().mean()


def _inputs(c=8, hw=5):
    torch.manual_seed(0)
    x = torch.randn(2, c, hw, hw).contiguous(memory_format=torch.channels_last).requires_grad_()
    return (x, torch.randn(c, 1, 7, 7, requires_grad=True), torch.randn(c, requires_grad=True),
            torch.randn(4, c, 1, 1, requires_grad=True))


@pytest.mark.parametrize("gain, contiguous", [(0.0, True), (float("inf"), False)])
def test_channels_last_convolution_training_matches_eager_in_either_layout(monkeypatch, gain, contiguous):
    monkeypatch.setattr(matmul, "CONTIGUOUS_GAIN", gain)
    chosen = _record_choices(monkeypatch)
    inputs = _inputs()
    c = compile_fn(_depthwise_then_pointwise, *inputs)
    loss = c(*inputs)
    loss.backward()
    got = [loss.detach()] + [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    ref_loss = _depthwise_then_pointwise(*inputs)
    ref_loss.backward()
    ref = [ref_loss.detach()] + [t.grad for t in inputs]
    assert close(got, ref, atol=1e-4, rtol=1e-4)
    assert [g.stride() for g in got] == [r.stride() for r in ref]
    # which path ran: the forward and backward convolutions with channels-last arguments
    assert len(chosen) >= 3 and all((s is not None) == contiguous for s in chosen), chosen


def _record_choices(monkeypatch):
    chosen = []
    measure = matmul._contiguous_strides_if_faster

    def recorded(ctx, node):
        strides = measure(ctx, node)
        chosen.append(strides)
        return strides
    monkeypatch.setattr(matmul, "_contiguous_strides_if_faster", recorded)
    return chosen


def test_channels_last_convolution_inference_matches_eager_in_either_layout(monkeypatch):
    x, w, b, _ = _inputs()
    x = x.detach()

    def fn(x, w, b):
        return F.conv2d(x, w, b, padding=3, groups=x.shape[1]).relu()
    with torch.no_grad():
        for gain in (0.0, float("inf")):
            monkeypatch.setattr(matmul, "CONTIGUOUS_GAIN", gain)
            c = compile_fn(fn, x, w.detach(), b.detach())
            out, ref = c(x, w.detach(), b.detach()), fn(x, w.detach(), b.detach())
            assert close(out, ref, atol=1e-5, rtol=1e-5) and out.stride() == ref.stride()
