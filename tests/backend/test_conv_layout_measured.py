"""The CPU's measured convolution layout (config.cpu_conv_layout = "measured", the default;
lower/layout_timing.py): an inference graph runs its convolutions channels-last where its
convolutions and the conversions that adds are timed faster than in eager's layouts, and
values stored between channels-last convolutions stay channels-last (CppTarget
.channels_last_stores). The timing is replaced here by fixed answers, so that each test
checks one decision; what the caller sees keeps eager's values and strides either way."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tempa
from tempa.backend.lower import layout_timing
from tempa.introspect import entries

from .helpers import close

CL = torch.channels_last


class Block(nn.Module):
    """An inverted residual block (MobileNetV2 / EfficientNet): pointwise expansion, BN,
    ReLU6, a depthwise convolution, BN, SiLU, a squeeze-and-excitation gate (a mean over
    the spatial dims read next to the value it gates), pointwise projection, BN, residual."""

    def __init__(self, c=8, e=4):
        super().__init__()
        self.pw1 = nn.Conv2d(c, c * e, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c * e)
        self.dw = nn.Conv2d(c * e, c * e, 3, padding=1, groups=c * e, bias=False)
        self.bn2 = nn.BatchNorm2d(c * e)
        self.pw2 = nn.Conv2d(c * e, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu6(self.bn1(self.pw1(x)))
        y = F.silu(self.bn2(self.dw(y)))
        gate = torch.sigmoid(y.mean((2, 3), keepdim=True))
        return self.bn3(self.pw2(y * gate)) + x, y


def _model():
    torch.manual_seed(0)
    m = Block().eval()
    for bn in (m.bn1, m.bn2, m.bn3):         # running stats away from the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return m


def _timed_as(monkeypatch, ratio):
    """Every timed pair answers (eager 1.0 s, channels-last ``ratio`` s); the calls are not
    run. Returns the list of pairs asked for."""
    asked = []

    def fake(f, g, budget_s=0.05):
        asked.append((f, g))
        return 1.0, ratio
    monkeypatch.setattr(layout_timing, "_time_pair", fake)
    layout_timing._seconds.clear()
    return asked


def _compile_and_check(fmt=torch.contiguous_format):
    m = _model()
    x = torch.randn(2, 8, 12, 12).contiguous(memory_format=fmt)
    c = tempa.compile(m)
    with torch.no_grad():
        got, want = c(x), m(x)
        got2 = c(x)
    assert close(got, want, atol=1e-5, rtol=1e-5) and close(got2, want, atol=1e-5, rtol=1e-5)
    assert [g.stride() for g in got] == [w.stride() for w in want]
    (entry,) = entries(c)
    assert entry.kernels.fallback_reason is None
    return entry.kernels


def test_the_cpu_default_is_measured():
    assert tempa.config.cpu_conv_layout == "measured"


def test_channels_last_where_measured_faster(monkeypatch):
    asked = _timed_as(monkeypatch, 0.5)
    info = _compile_and_check()
    said = info.passes.get("layout", "")
    assert "inference: measured: " in said and ": channels-last" in said, said
    assert "inference: channels_last: 3 of 3 convolution calls" in said, said
    # the three convolution pairs, and the conversion of the input (the weights of 1x1 and
    # depthwise convolutions are channels-last already) and of the returned feature map
    assert len(asked) >= 4
    convs = [n for n in info.inference.passes["aten"].graph.nodes
             if n.target is torch.ops.aten.convolution.default]
    assert all(n.args[0].meta["traced_meta"].stride[1] == 1 for n in convs)


def test_eager_layouts_where_channels_last_measured_slower(monkeypatch):
    _timed_as(monkeypatch, 1.0)            # a tie: not MEASURED_GAIN faster
    info = _compile_and_check()
    said = info.passes.get("layout", "")
    assert "inference: measured: " in said and ": eager layouts" in said, said
    assert "channels_last:" not in said
    assert not any(n.kwargs.get("memory_format") is CL for n in info.inference.passes["aten"].graph.nodes)


def test_channels_last_input_keeps_eager_results(monkeypatch):
    _timed_as(monkeypatch, 0.5)
    _compile_and_check(CL)


def test_values_between_channels_last_convolutions_are_stored_channels_last(monkeypatch):
    """The depthwise convolution's BN + SiLU output is read by the mean and by the gated
    product: stored once, in NHWC memory order (sizes 2 x 12 x 12 x 32), not contiguous NCHW
    with every reader reading it transposed."""
    _timed_as(monkeypatch, 0.5)
    info = _compile_and_check()
    lowered = str(info.inference.passes["lower"])
    stored = re.findall(r"^buf\d+: float32\[([\d, ]+)\] = pointwise of .*\[aten\.\w+\.\w+\]$", lowered, re.M)
    # (the gate, sigmoid of a (2, 32, 1, 1) value every pixel reads, is stored too:
    # lowerings.BROADCAST_READS)
    spatial = [s for s in stored if s != "2, 32, 1, 1"]
    assert spatial and all(s == "2, 12, 12, 32" for s in spatial), stored


def test_training_keeps_eager_layouts(monkeypatch):
    asked = _timed_as(monkeypatch, 0.5)
    m = _model().train()
    x = torch.randn(2, 8, 12, 12, requires_grad=True)
    c = tempa.compile(m)
    out, _ = c(x)
    out.sum().backward()
    assert not asked
    assert "training: channels_last" not in (entries(c)[0].kernels.passes.get("layout") or "")


def test_measured_on_real_timings_runs_and_matches():
    """No fake timings: whatever the machine measures, eager's results."""
    layout_timing._seconds.clear()
    info = _compile_and_check()
    assert "inference: measured: " in info.passes.get("layout", "")


def test_channel_means_of_a_channels_last_value_run_with_the_channels_innermost(monkeypatch):
    """The gate's mean over H and W of the NHWC SiLU output, computed in the kernel that
    makes that value: a column sum (an accumulator per channel, the channels innermost,
    codegen/cpp.py _render_member_columns), not a strided row loop per channel."""
    _timed_as(monkeypatch, 0.5)
    info = _compile_and_check()
    src = info.inference.cpp_source
    sums = re.findall(r"alignas\(64\) float acc_(buf\d+)\[32\];", src)
    assert sums, src
    assert re.search(r"^\s*float acc_%s = " % sums[0], src, re.M) is None


def test_batchnorm_then_silu_is_one_expression_not_a_stored_value(monkeypatch):
    """SiLU decomposes to ``x * sigmoid(x)``: the BatchNorm output ``x`` has two FX users
    that are one expression (lowerings._consumers), so it is inlined into the kernel that
    makes the next convolution's input, not stored and read back."""
    monkeypatch.setattr(tempa.config, "cpu_conv_layout", "eager")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(4, 8, 1), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 8, 3)).eval()
    m[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 4, 10, 10)
    c = tempa.compile(m)
    with torch.no_grad():
        got, want = c(x), m(x)
    assert close(got, want, atol=1e-5, rtol=1e-5) and got.stride() == want.stride()
    lowered = str(entries(c)[0].kernels.inference.passes["lower"])
    stored = re.findall(r"^buf\d+: .* = pointwise of .*\[(.*)\]$", lowered, re.M)
    assert stored == ["input of aten.convolution.default"], stored


def test_a_value_reduced_and_used_elementwise_is_still_stored_once(monkeypatch):
    """softmax's ``exp(x - amax(x))``: amax's only user is the subtraction, another user of
    ``x``, but amax is a loop of its own: ``x`` (an expensive value) is stored once, not
    recomputed in the max loop and again in the subtraction (lowerings._consumers counts
    only users of ``x``'s shape as part of one expression)."""
    from tempa.backend.lower import lowerings

    def f(a, b):
        s = ((a * b + 1).tanh() * a + b).sin() * 3 + (a - b).cos() * (a + 2).exp()
        return torch.softmax(s, dim=-1)
    a, b = torch.randn(4, 64), torch.randn(4, 64)

    def stored():
        c = tempa.compile(f)
        got = c(a, b)
        assert close(got, f(a, b), atol=1e-5, rtol=1e-5)
        lowered = str(entries(c)[0].kernels.inference.passes["lower"])
        return re.findall(r"^buf\d+: float32\[4, 64\] = pointwise of \(in0, in1\)", lowered, re.M)
    assert stored()
    monkeypatch.setattr(lowerings, "_shape", lambda n: ())      # every user "elementwise"
    assert not stored()


class FlattenHead(nn.Module):
    """A classic CNN: convolutions, then ``flatten`` of the last feature map into a Linear."""
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1)), x.view(x.shape[0], 16, -1)


def test_flatten_of_a_channels_last_feature_map(monkeypatch):
    """The trace's flatten is a view of an eager-layout (contiguous) feature map; replayed on
    the channels-last one it is no view (the relayout replays it as reshape, which copies
    contiguous there: lower/replay.py). Before, the replay raised and the whole graph ran
    eagerly."""
    _timed_as(monkeypatch, 0.1)                   # channels-last measured faster
    torch.manual_seed(0)
    m = FlattenHead().eval()
    x = torch.randn(2, 3, 16, 16)
    c = tempa.compile(m)
    with torch.no_grad():
        got, want = c(x), m(x)
    assert close(got, want, atol=1e-5, rtol=1e-5)
    assert [g.stride() for g in got] == [w.stride() for w in want]
    (entry,) = entries(c)
    assert entry.kernels.fallback_reason is None, entry.kernels.fallback_reason
    said = entry.kernels.passes.get("layout", "")
    assert "inference: channels_last: 2 of 2 convolution calls" in said, said


def test_as_strided_of_a_feature_map_reads_eager_layout_elements(monkeypatch):
    """``as_strided`` names elements by their place in memory, which the channels-last
    relayout changes: it is replayed on the value in its traced layout (lower/replay.py
    _READS_STORAGE); before, it read other elements (a wrong answer)."""
    _timed_as(monkeypatch, 0.1)
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 8, 3, padding=1).eval()

    def f(x):
        return conv(x).as_strided((2, 8, 4, 4), (512, 64, 16, 2))
    x = torch.randn(2, 4, 8, 8)
    c = tempa.compile(f)
    with torch.no_grad():
        got, want = c(x), f(x)
    assert close(got, want, atol=1e-6, rtol=1e-6)
    (entry,) = entries(c)
    assert entry.kernels.fallback_reason is None, entry.kernels.fallback_reason
    assert "inference: channels_last: 1 of 1 convolution calls" in entry.kernels.passes.get("layout", "")
