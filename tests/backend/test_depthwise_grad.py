"""A depthwise convolution's weight and bias gradients as C++ loops (lower/depthwise.py):
equal to eager's float64 ones, with ATen asked for the input gradient alone, for the
filters that lowering takes (5x5 and larger); a 3x3 filter keeps ATen's whole backward."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.lower.depthwise import LOOP_MIN_TAPS

WEIGHT_LOOPS = "convolution_backward(depthwise weight)"


def _backward_schedule(compiled) -> str:
    infos = [e.compiled.tempa_info for e in tempa.entries(compiled)]
    return "\n".join(str(i.backward.passes.get("schedule", "")) for i in infos if i.backward is not None)


def _externs(compiled) -> list:
    return [x for e in tempa.entries(compiled) for x in e.compiled.tempa_info.backward.extern_calls]


def _step(model, x, g):
    y = model(x)
    y.backward(g)
    return y


@pytest.mark.parametrize("kernel,stride,dilation,bias,channels_last", [
    (7, 1, 1, True, False),      # ConvNeXt's
    (5, 2, 1, True, False),      # EfficientNet's stride-2 5x5
    (7, 2, 2, False, False),     # stride and dilation, no bias
    (7, 1, 1, True, True),       # a channels-last input
])
def test_depthwise_weight_gradient_as_loops(kernel, stride, dilation, bias, channels_last):
    torch.manual_seed(0)
    c = 12
    conv = nn.Conv2d(c, c, kernel, stride=stride, padding=kernel // 2 * dilation, dilation=dilation,
                     groups=c, bias=bias)
    ref = copy.deepcopy(conv).double()
    eager = copy.deepcopy(conv)
    x = torch.randn(2, c, 19, 17)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    x64 = x.detach().double().requires_grad_()
    tempa.reset()
    compiled = tempa.compile(conv)
    y = compiled(x)
    g = torch.randn_like(y)
    y.backward(g)
    _step(ref, x64, g.double())
    _step(eager, x.detach().requires_grad_(), g)
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conv.weight.grad.double(), ref.weight.grad, **close)
    if bias:
        torch.testing.assert_close(conv.bias.grad.double(), ref.bias.grad, **close)
    torch.testing.assert_close(x.grad.double(), x64.grad, **close)
    assert conv.weight.grad.stride() == eager.weight.grad.stride()
    assert WEIGHT_LOOPS in _backward_schedule(compiled)


def test_the_first_layer_asks_aten_for_nothing():
    """An input that needs no gradient: no convolution_backward call is left at all."""
    torch.manual_seed(1)
    conv = nn.Conv2d(8, 8, 7, padding=3, groups=8)
    ref = copy.deepcopy(conv).double()
    x = torch.randn(2, 8, 16, 16)
    tempa.reset()
    compiled = tempa.compile(conv)
    y = compiled(x)
    g = torch.randn_like(y)
    y.backward(g)
    _step(ref, x.double(), g.double())
    torch.testing.assert_close(conv.weight.grad.double(), ref.weight.grad, rtol=1e-5, atol=1e-5)
    assert WEIGHT_LOOPS in _backward_schedule(compiled)
    assert not any("convolution_backward" in e for e in _externs(compiled))


def test_a_three_by_three_filter_keeps_atens_backward():
    assert 3 * 3 < LOOP_MIN_TAPS
    torch.manual_seed(2)
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)
    x = torch.randn(2, 8, 16, 16, requires_grad=True)
    tempa.reset()
    compiled = tempa.compile(conv)
    compiled(x).sum().backward()
    assert WEIGHT_LOOPS not in _backward_schedule(compiled)
    assert any("convolution_backward" in e for e in _externs(compiled))


def test_one_value_for_both_dims():
    """ATen's convolution takes stride, padding and dilation as one value for both dims
    (EfficientNet's convolutions reach convolution_backward with padding [2])."""
    torch.manual_seed(3)
    w = torch.randn(6, 1, 5, 5, requires_grad=True)
    x = torch.randn(1, 6, 11, 9, requires_grad=True)

    def f(x, w):
        return torch.ops.aten.convolution(x, w, None, [2], [2], [1], False, [0], 6)
    tempa.reset()
    compiled = tempa.compile(f)
    y = compiled(x, w)
    g = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    rx, rw = torch.autograd.grad(f(x64, w64), (x64, w64), g.double())
    torch.testing.assert_close(gw.double(), rw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx.double(), rx, rtol=1e-5, atol=1e-5)
    assert WEIGHT_LOOPS in _backward_schedule(compiled)


def test_gradients_stay_right_when_the_batch_size_changes():
    """A second batch size (a recompile, shape-generic under dynamic=True, where the loops are
    not used): every step's gradients are eager's."""
    torch.manual_seed(4)
    conv = nn.Conv2d(6, 6, 7, padding=3, groups=6)
    ref = copy.deepcopy(conv).double()
    tempa.reset()
    compiled = tempa.compile(conv, dynamic=True)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 6, 10, 10)
        g = torch.randn(batch, 6, 10, 10)
        conv.zero_grad()
        ref.zero_grad()
        compiled(x).backward(g)
        ref(x.double()).backward(g.double())
        # sums of up to 500 products: float32 rounding against float64
        torch.testing.assert_close(conv.weight.grad.double(), ref.weight.grad, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(conv.bias.grad.double(), ref.bias.grad, rtol=1e-5, atol=1e-4)
