"""BatchNorm's and GroupNorm's training backward from their own derivatives (lower/joint.py
KEEP_WHOLE_FOR_AUTOGRAD). BatchNorm: autograd records native_batch_norm_backward, which reads the
mean and inverse std the forward saved, so the backward makes one pass of two sums over
(grad, input) and one pointwise pass. Differentiating the decomposed forward instead
recomputed the batch mean from the input and wrote an extra full-size gradient in
between (three reductions and two pointwise passes a BatchNorm). Gradients, outputs and
running statistics are checked against eager in float64."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import tempa


def _backward_schedule(compiled) -> str:
    infos = [e.compiled.tempa_info for e in tempa.entries(compiled)]
    return "\n".join(str(i.backward.passes.get("schedule", "")) for i in infos if i.backward is not None)


def _reduction_kernels(schedule: str) -> list:
    """The kernels of a schedule whose members include a reduction (sum, mean)."""
    return [line for line in schedule.splitlines()
            if line.strip().startswith("kernel") and ("[sum" in line or "[mean" in line)]


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("channels_last", [False, True])
def test_batchnorm_backward_one_pass_of_sums(channels_last):
    tempa.reset()
    torch.manual_seed(0)
    model = ConvBnRelu().train()
    ref = copy.deepcopy(model).double()
    x = torch.randn(4, 3, 12, 12) * 2 + 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    g = torch.randn(4, 8, 12, 12)
    compiled = tempa.compile(model)
    y = compiled(x)
    y.backward(g)
    yr = ref(x.double())
    yr.backward(g.double())
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.double(), yr, **close)
    torch.testing.assert_close(model.conv.weight.grad.double(), ref.conv.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model.bn.weight.grad.double(), ref.bn.weight.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model.bn.bias.grad.double(), ref.bn.bias.grad, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(model.bn.running_mean.double(), ref.bn.running_mean, **close)
    torch.testing.assert_close(model.bn.running_var.double(), ref.bn.running_var, **close)
    assert model.bn.num_batches_tracked.item() == 1
    schedule = _backward_schedule(compiled)
    assert "convolution_backward" in schedule          # the compiled backward ran
    # one kernel of sums for the BatchNorm (its weight and bias gradients come with it),
    # and no mean of the input recomputed
    assert len(_reduction_kernels(schedule)) == 1, schedule
    assert "[mean" not in schedule, schedule


def test_batchnorm_input_gradient_without_affine():
    """No weight, no bias: the input's gradient alone, through the same formula."""
    tempa.reset()
    torch.manual_seed(1)
    bn = nn.BatchNorm1d(6, affine=False).train()
    ref = copy.deepcopy(bn).double()
    x = (torch.randn(32, 6) * 3 - 1).requires_grad_()
    xr = x.detach().double().requires_grad_()
    compiled = tempa.compile(bn)
    (compiled(x) ** 2).sum().backward()
    (ref(xr) ** 2).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)
    assert "[mean" not in _backward_schedule(compiled)


def test_groupnorm_training_backward_is_compiled():
    """GroupNorm (a UNet's, a diffusion model's) differentiated through its own derivative:
    the backward is compiled (it ran as eager ATen calls, a copy_ in the recorded backward),
    its gradients equal eager's float64 ones."""
    tempa.reset()
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU()).train()
    ref = copy.deepcopy(model).double()
    x = torch.randn(4, 8, 16, 16) * 2 + 1
    g = torch.randn(4, 16, 16, 16)
    compiled = tempa.compile(model)
    compiled(x).backward(g)
    ref(x.double()).backward(g.double())
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-5, atol=1e-4, msg=name)
    info = [e.compiled.tempa_info for e in tempa.entries(compiled)][0]
    assert info.backward is not None and info.fallback_reason is None, info.fallback_reason
    assert "convolution_backward" in _backward_schedule(compiled)

