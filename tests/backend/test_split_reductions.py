"""Split reductions (lower/reductions.py split_plan): on the GPU a reduction with few results
over many values runs as partial reductions and a short reduction of the partials, so that
it fills the SMs. The plan is checked on its own; the kernels run through Triton's CPU
interpreter (test_gpu.py's way), against eager in float64, with the split on and off."""
from __future__ import annotations

import copy
import os
import re

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.lower.core import LowerOptions, SizeChoices
from tempa.backend.lower.reductions import split_plan

try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False

interp = pytest.mark.skipif(not HAVE_TRITON or torch.cuda.is_available()
                            or os.environ.get("TRITON_INTERPRET") != "1",
                            reason="CPU-only check through Triton's interpreter")

GPU = LowerOptions(split_reduction_results=2112)      # the Triton target's: 16 per SM of 132


def test_batchnorm_statistics_split_over_the_batch():
    # ResNet-50's first BatchNorm at b32: 64 results of 32 x 112 x 112 values each
    assert split_plan([64], [32, 112, 112], "sum", GPU) == (0, 32)
    # a Linear's bias gradient over 8192 rows: 768 results, 4 pieces of 2048 rows give 3072
    assert split_plan([768], [8192], "sum", GPU) == (0, 4)
    # a batch of one: the first reduced dim that divides is split instead
    assert split_plan([1, 64, 1, 1], [1, 112, 112], "max", GPU) == (1, 8)


def test_reductions_that_stay_whole():
    assert split_plan([4096], [768], "sum", GPU) is None            # LayerNorm rows: enough results
    assert split_plan([64], [4000], "sum", GPU) is None             # few values per result
    assert split_plan([64], [32, 112, 112], "argmax", GPU) is None  # the index is not associative
    assert split_plan([64], [32, 112, 112], "sum", LowerOptions()) is None   # the C++ target
    generic = LowerOptions(split_reduction_results=2112, size_choices=SizeChoices())
    assert split_plan([64], [32, 112, 112], "sum", generic) is None  # pieces depend on the sizes


def test_each_piece_keeps_enough_values():
    # 2 results: 1056 pieces would be wanted, but each piece keeps at least 1024 of 16384 values
    dim, pieces = split_plan([2], [16, 1024], "sum", GPU)
    assert (dim, pieces) == (0, 16)


def _gpu_backend(gm, ex):
    from tempa.backend.gpu import gpu_backend
    return gpu_backend(gm, ex)


def _schedules(compiled):
    infos = [e.compiled.tempa_info for e in tempa.entries(compiled)]
    text = []
    for info in infos:
        for part in (getattr(info, "forward", None), getattr(info, "backward", None),
                     getattr(info, "inference", None)):
            if part is not None:
                text.append(str(part.passes.get("schedule", "")))
    return "\n".join(text)


@pytest.fixture
def split_setting():
    before = tempa.config.gpu_split_reductions
    yield
    tempa.config.gpu_split_reductions = before
    tempa.reset()


@interp
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("split", [True, False])
def test_batchnorm_training_step_through_split_kernels(channels_last, split, split_setting):
    """Forward statistics, running statistics and the backward's sums over (N, H, W): equal
    to eager's float64 within float32 rounding, whether split or not."""
    tempa.reset()
    tempa.config.gpu_split_reductions = split
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8).train()
    ref = copy.deepcopy(bn).double()
    x = torch.randn(16, 8, 32, 32) * 3 + 1
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    xr = x.detach().double().requires_grad_()
    compiled = tempa.compile(bn, backend=_gpu_backend)
    y = compiled(x)
    (y * y.detach().flip(0)).sum().backward()
    yr = ref(xr)
    (yr * yr.detach().flip(0)).sum().backward()
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.double(), yr, **close)
    torch.testing.assert_close(x.grad.double(), xr.grad, **close)
    torch.testing.assert_close(bn.weight.grad.double(), ref.weight.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(bn.bias.grad.double(), ref.bias.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(bn.running_mean.double(), ref.running_mean, **close)
    torch.testing.assert_close(bn.running_var.double(), ref.running_var, **close)
    assert ("(split 16)" in _schedules(compiled)) == split


@interp
def test_whole_tensor_reductions_split(split_setting):
    """One result over every value: a sum, a max (with a NaN-free exact answer) and an
    any; each equal to eager's, each split."""
    tempa.reset()
    tempa.config.gpu_split_reductions = True
    torch.manual_seed(1)
    x = torch.randn(64, 512)
    x[37, 100] = 9.5            # the max, found in one piece of the split

    def f(x):
        return x.sum(), x.amax(), (x > 9).any(), x.sum(0)
    compiled = tempa.compile(f, backend=_gpu_backend)
    got, want = compiled(x), f(x)
    torch.testing.assert_close(got[0].double(), x.double().sum(), rtol=1e-6, atol=1e-4)
    assert got[1].item() == 9.5 and got[2].item() is True
    torch.testing.assert_close(got[3], want[3], rtol=1e-5, atol=1e-5)
    assert "(split " in _schedules(compiled)


@interp
def test_sums_sharing_a_loop_equal_eager(split_setting):
    """A BatchNorm's variance sums and its backward's two sums, in one r loop each
    (codegen/triton.py _shared_loops; whole reductions, split off, so the loop is long):
    the statistics, the input's and the affine gradients equal eager's float64."""
    tempa.reset()
    tempa.config.gpu_split_reductions = False
    torch.manual_seed(2)
    bn = nn.BatchNorm2d(4).train()
    ref = copy.deepcopy(bn).double()
    x = (torch.randn(8, 4, 48, 48) * 2 + 3).requires_grad_()
    xr = x.detach().double().requires_grad_()
    compiled = tempa.compile(bn, backend=_gpu_backend)
    g = torch.randn(8, 4, 48, 48)
    compiled(x).backward(g)
    ref(xr).backward(g.double())
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.weight.grad.double(), ref.weight.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(bn.bias.grad.double(), ref.bias.grad, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(bn.running_var.double(), ref.running_var, rtol=1e-5, atol=1e-5)
    sources = [getattr(getattr(e.compiled.tempa_info, part), "triton_source", "")
               for e in tempa.entries(compiled) for part in ("forward", "backward")]
    loops = [body for src in sources for body in src.split("for r0 in range(")[1:]]
    accumulators = [set(re.findall(r"(acc_m\d+) = acc_m\d+ \+", body)) for body in loops]
    assert any(len(a) >= 2 for a in accumulators), accumulators   # two sums, one loop
