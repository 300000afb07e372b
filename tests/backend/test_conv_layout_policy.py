"""The channels-last convolution policy (lower/layout.py CONV_LAYOUTS; on by default on CUDA,
config.gpu_conv_layout): 4-D convolutions get channels-last input and weight, the ops
between them follow, and what the caller sees keeps eager's layouts (returned tensors,
gradients, BatchNorm's running stats). Checked on the CPU with config.cpu_conv_layout
forced on (values, gradients and strides against eager), and by planning a CUDA-target
graph without a GPU (which layouts the convolutions and kernels get)."""
import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import tempa
from tempa.introspect import entries
from tempa.backend.gpu import compile as gc
from tempa.backend.ir import ExternCall
from tempa.backend.lower import matmul
from tempa.backend.lower.decomps import table
from tempa.backend.lower.joint import trace_training
from tempa.backend.lower.layout import is_channels_last
from tempa.backend.lower.replay import relayout_convolutions
from tempa.backend.lower.trace import trace_forward

from .helpers import close, compile_fn

aten = torch.ops.aten
CL = torch.channels_last


@pytest.fixture
def channels_last(monkeypatch):
    monkeypatch.setattr(tempa.config, "cpu_conv_layout", "channels_last")


class Net(nn.Module):
    """Conv + BN + ReLU, a stride-2 convolution, a depthwise and a grouped one, a residual
    add, and a feature map returned next to the pooled result."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.bn2 = nn.BatchNorm2d(c)
        self.grouped = nn.Conv2d(c, c, 1, groups=2)
        self.pw = nn.Conv2d(c, 2 * c, 1)

    def forward(self, x):
        y = torch.relu(self.bn1(self.stem(x)))
        z = torch.relu(self.bn2(self.dw(y)) + y)
        z = self.grouped(z) + z
        out = self.pw(z)
        return out.mean((2, 3)), z


def _pair(seed=0):
    torch.manual_seed(seed)
    ref = Net()
    mine = Net()
    mine.load_state_dict(ref.state_dict())
    return ref, mine


def _conv_args_channels_last(gm):
    """(input, weight) channels-last-ness of each convolution of ``gm``."""
    return [tuple(is_channels_last(a.meta["traced_meta"]) for a in n.args[:2])
            for n in gm.graph.nodes if n.target is aten.convolution.default]


def test_inference_matches_eager_values_and_strides(channels_last):
    ref, mine = _pair()
    ref.eval(), mine.eval()
    x = torch.randn(2, 3, 16, 16)
    c = tempa.compile(mine)
    with torch.no_grad():
        got, want = c(x), ref(x)
    assert close(got, want, atol=1e-5, rtol=1e-5)
    assert [g.stride() for g in got] == [w.stride() for w in want]
    _assert_compiled_channels_last(c, "inference")


def test_training_matches_eager_grads_running_stats_and_strides(channels_last):
    ref, mine = _pair()
    x = torch.randn(2, 3, 16, 16)
    c = tempa.compile(mine)
    for _ in range(2):                                 # the second call runs the compiled graphs
        for m in (ref, mine):
            m.zero_grad(set_to_none=True)
        pooled, feat = c(x)
        (pooled.square().sum() + feat.sum()).backward()
        pooled_r, feat_r = ref(x)
        (pooled_r.square().sum() + feat_r.sum()).backward()
        assert close([pooled, feat], [pooled_r, feat_r], atol=1e-4, rtol=1e-4)
        assert [pooled.stride(), feat.stride()] == [pooled_r.stride(), feat_r.stride()]
        for (name, p), pr in zip(mine.named_parameters(), ref.parameters()):
            assert close(p.grad, pr.grad, atol=1e-4, rtol=1e-4), name
            assert p.grad.stride() == pr.grad.stride(), name
        for b, br in zip(mine.buffers(), ref.buffers()):
            assert close(b, br, atol=1e-5, rtol=1e-5) and b.stride() == br.stride()
    _assert_compiled_channels_last(c, "training")


def _assert_compiled_channels_last(compiled, variant):
    """One captured graph, compiled (not run eagerly), its convolutions channels-last."""
    (entry,) = entries(compiled)
    info = entry.kernels
    assert info.fallback_reason is None and not info.notes, info.notes
    assert f"{variant}: channels_last: " in info.passes["layout"], info.passes.get("layout")
    assert " 0 of " not in info.passes["layout"]


def test_input_gradient_keeps_the_input_layout(channels_last):
    """A contiguous input's gradient is contiguous, a channels-last one's channels-last, as
    eager gives them; the convolution runs channels-last in between either way."""
    def f(x, w):
        return F.conv2d(torch.relu(x), w, padding=1).tanh().sum()
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    for fmt in (torch.contiguous_format, CL):
        x = torch.randn(2, 3, 6, 6).contiguous(memory_format=fmt).requires_grad_()
        c = compile_fn(f, x, w)
        c(x, w).backward()
        got = [x.grad, w.grad]
        x.grad = w.grad = None
        f(x, w).backward()
        assert close(got, [x.grad, w.grad], atol=1e-4, rtol=1e-4)
        assert [g.stride() for g in got] == [x.grad.stride(), w.grad.stride()]
        x.grad = w.grad = None


def _block(x, w1, w2, w3):
    y = torch.relu(F.conv2d(x, w1, stride=2, padding=1))
    z = F.conv2d(y, w2, padding=1) + y
    return torch.relu(F.conv2d(z, w3)), z, z.permute(0, 2, 3, 1)


def _block_inputs(requires_grad=False):
    torch.manual_seed(0)
    ts = [torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3), torch.randn(8, 8, 3, 3),
          torch.randn(8, 8, 1, 1)]
    return [t.requires_grad_(requires_grad) for t in ts]


def test_relayout_converts_conv_arguments_and_keeps_output_strides():
    """The trace itself: every convolution gets channels-last input and weight, and the
    returned tensors (a feature map, a permuted view of one) have eager's strides."""
    ins = _block_inputs()
    tr = trace_forward(fx.symbolic_trace(_block), ins, table(), differentiable=False)
    assert _conv_args_channels_last(tr.gm)[:2] == [(False, False)] * 2
    relaid = relayout_convolutions(tr, ins, table())
    assert _conv_args_channels_last(relaid.gm) == [(True, True)] * 3
    out = next(n for n in relaid.gm.graph.nodes if n.op == "output").args[0]
    eager = [o.stride() for o in _block(*ins)]
    assert [n.meta["traced_meta"].stride for n in out] == eager


def test_policy_off_converts_nothing(monkeypatch):
    """config "eager" (the A/B switch) leaves the traced graph as eager's."""
    monkeypatch.setattr(tempa.config, "cpu_conv_layout", "eager")
    ins = _block_inputs()
    c = compile_fn(_block, *ins)
    with torch.no_grad():
        c(*ins)
    assert "layout" not in c.tempa_info.passes
    assert not any(n.kwargs.get("memory_format") is CL for n in c.tempa_info.inference.passes["aten"].graph.nodes)


def test_compiled_graph_says_what_the_policy_did(channels_last):
    ins = _block_inputs()
    c = compile_fn(_block, *ins)
    with torch.no_grad():
        c(*ins)
    said = c.tempa_info.passes["layout"]
    assert "inference: channels_last: 3 of 3 convolution calls" in said, said
    assert "=== layout ===" in c.tempa_info.trace()


def test_grouped_convolution_keeps_its_layout():
    """A grouped convolution with several channels per group stays NCHW (cuDNN's NHWC grouped
    kernels are slow); a depthwise one converts."""
    def f(x, wg, wd):
        return F.conv2d(F.conv2d(x, wg, groups=2), wd, groups=4)
    ins = [torch.randn(2, 4, 6, 6), torch.randn(4, 2, 3, 3), torch.randn(4, 1, 3, 3)]
    tr = trace_forward(fx.symbolic_trace(f), ins, table(), differentiable=False)
    relaid = relayout_convolutions(tr, ins, table())
    assert _conv_args_channels_last(relaid.gm) == [(False, False), (True, True)]


def test_contiguous_of_a_channels_last_convolution_is_returned_contiguous(monkeypatch):
    """A convolution's channels-last result returned through .contiguous() (which lowers to
    the value itself) is copied into eager's contiguous layout; it was handed out
    channels-last. No policy needed: the input is channels-last."""
    monkeypatch.setattr(matmul, "CONTIGUOUS_GAIN", float("inf"))   # keep the traced layouts

    def f(x, w):
        return F.conv2d(x, w).contiguous()
    x = torch.randn(2, 8, 6, 6).contiguous(memory_format=CL)
    w = torch.randn(8, 8, 1, 1)
    with torch.no_grad():
        got, want = compile_fn(f, x, w)(x, w), f(x, w)
    assert close(got, want, atol=1e-5, rtol=1e-5) and got.stride() == want.stride() == (288, 36, 6, 1)


# --- a CUDA-target plan, without a GPU -----------------------------------------------------

@pytest.fixture
def untimed(monkeypatch):
    """The graphs here are traced on the CPU, whose convolution sites are timed against
    contiguous arguments (lower/matmul.py); a CUDA graph's never are. Keep the traced layouts."""
    monkeypatch.setattr(matmul, "CONTIGUOUS_GAIN", float("inf"))


def _externs_and_kernels(gm, num_outputs, mutated, n_in, label="inference"):
    plan = gc.plan_graph(gm, num_outputs, mutated, n_in, label)
    externs = [it for it in plan.items if isinstance(it, ExternCall)]
    kernels = [it[0] for it in plan.items if not isinstance(it, ExternCall)]
    return externs, kernels


def _strides_of(arg):
    return tuple(arg.strided[1])


def test_gpu_plan_runs_convolutions_channels_last_without_extra_copies(untimed):
    """Under bf16 autocast: each convolution reads channels-last buffers, the ReLU between two
    convolutions (read by the next one and by the residual add) is stored channels-last once,
    and the plan has no more kernels than the eager-layout one (the input's conversion fuses
    into its cast, each weight's into its cast to bf16)."""
    ins = _block_inputs()
    with torch.autocast("cpu", torch.bfloat16):
        tr = trace_forward(fx.symbolic_trace(_block), ins, table(), differentiable=False)
        relaid = relayout_convolutions(tr, ins, table())
    eager_externs, eager_kernels = _externs_and_kernels(tr.gm, tr.num_outputs, tr.mutated, len(ins))
    externs, kernels = _externs_and_kernels(relaid.gm, relaid.num_outputs, relaid.mutated, len(ins))
    assert [e.op for e in externs] == [aten.convolution.default] * 3
    for e in externs:
        x, w = e.args[:2]
        assert torch.empty_strided(x.sizes, _strides_of(x), device="meta").is_contiguous(memory_format=CL)
        assert torch.empty_strided(w.sizes, _strides_of(w), device="meta").is_contiguous(memory_format=CL)
    assert len(kernels) <= len(eager_kernels), (len(kernels), len(eager_kernels))


def test_gpu_plan_of_the_backward_gives_convolution_backward_channels_last_arguments(untimed):
    """The joint trace: convolution_backward reads channels-last gradient, input and weight;
    the weight gradients come out in the weights' (contiguous) layout."""
    ins = _block_inputs(requires_grad=True)

    def loss(x, w1, w2, w3):
        a, b, _ = _block(x, w1, w2, w3)
        return a.sum() + b.square().sum()
    joint = trace_training(fx.symbolic_trace(loss), ins, table(), "channels_last")
    assert _conv_args_channels_last(joint.fw) == [(True, True)] * 3
    backward_convs = [n for n in joint.bw.graph.nodes if n.target is aten.convolution_backward.default]
    assert len(backward_convs) == 3
    for n in backward_convs:
        assert all(is_channels_last(a.meta["traced_meta"]) for a in n.args[:3]), n.format_node()
    grads = next(n for n in joint.bw.graph.nodes if n.op == "output").args[0]
    assert [g.meta["traced_meta"].stride for g in grads] == [ins[i].stride() for i in joint.grad_inputs]
    n_bw_in = len(joint.saved_inputs) + joint.num_saved + len(joint.diff_outputs)
    externs, _ = _externs_and_kernels(joint.bw, len(joint.grad_inputs), [], n_bw_in, "backward")
    for e in externs:
        if e.op is aten.convolution_backward.default:
            for a in e.args[:3]:
                assert torch.empty_strided(a.sizes, _strides_of(a), device="meta").is_contiguous(memory_format=CL)


def _conv_bn_relu_net(x, w1, w2, g1, b1, g2, b2, m1, v1, m2, v2):
    y = torch.relu(F.batch_norm(F.conv2d(x, w1, padding=1), m1, v1, g1, b1, training=True))
    y = torch.relu(F.batch_norm(F.conv2d(y, w2, stride=2, padding=1), m2, v2, g2, b2, training=True))
    return y.mean((2, 3)).float().square().sum()


def test_gpu_plan_of_a_training_step_has_no_more_kernels_than_in_eager_layouts(untimed):
    """Conv + BatchNorm (training) + ReLU under bf16 autocast, forward and backward: channels-
    last costs no kernel (weight conversions fuse into the casts, gradients' conversions back
    into the casts to float32, and the BatchNorm backward's pointwise chain on channels-last
    values still fuses into one kernel: the GPU scheduler reads a channels-last member at
    its own element)."""
    def p(*s):
        return torch.randn(*s).requires_grad_()
    c = 8
    ins = [torch.randn(2, 3, 16, 16), p(c, 3, 3, 3), p(2 * c, c, 3, 3), p(c), p(c), p(2 * c), p(2 * c),
           torch.zeros(c), torch.ones(c), torch.zeros(2 * c), torch.ones(2 * c)]
    counts = {}
    for layout in ("eager", "channels_last"):
        with torch.autocast("cpu", torch.bfloat16):
            j = trace_training(fx.symbolic_trace(_conv_bn_relu_net), ins, table(), layout)
        n_bw_in = len(j.saved_inputs) + j.num_saved + len(j.diff_outputs)
        _, fw = _externs_and_kernels(j.fw, j.num_outputs, j.mutated, len(ins), "forward")
        _, bw = _externs_and_kernels(j.bw, len(j.grad_inputs), [], n_bw_in, "backward")
        counts[layout] = (len(fw), len(bw))
    assert _conv_args_channels_last(j.fw) == [(True, True)] * 2
    assert counts["channels_last"][0] <= counts["eager"][0] and counts["channels_last"][1] <= counts["eager"][1], counts


# --- on CUDA (the lead's H200; skipped here) -------------------------------------------------

def _has_cuda_and_triton():
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.skipif(not _has_cuda_and_triton(), reason="needs CUDA and Triton")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=lambda m: m or "default")
@pytest.mark.parametrize("layout", ["channels_last", "eager"])
def test_cuda_training_and_inference_keep_eager_results(monkeypatch, mode, layout):
    """On CUDA, the default policy (and its A/B switch): values, .grad and running stats as
    eager's, the strides of outputs and of every .grad as eager's, over two training calls
    (the second replays under reduce-overhead) and an inference call."""
    monkeypatch.setattr(tempa.config, "gpu_conv_layout", layout)
    ref, mine = _pair()
    ref, mine = ref.cuda(), mine.cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    c = tempa.compile(mine, mode=mode)
    for _ in range(2):
        for m in (ref, mine):
            m.zero_grad(set_to_none=True)
        got, want = c(x), ref(x)
        (got[0].square().sum() + got[1].sum()).backward()
        (want[0].square().sum() + want[1].sum()).backward()
        assert close(got, want, atol=1e-2, rtol=1e-2)
        assert [g.stride() for g in got] == [w.stride() for w in want]
        for (name, p), pr in zip(mine.named_parameters(), ref.parameters()):
            assert close(p.grad, pr.grad, atol=1e-2, rtol=1e-2), name
            assert p.grad.stride() == pr.grad.stride(), name
    for b, br in zip(mine.buffers(), ref.buffers()):
        assert close(b, br, atol=1e-2, rtol=1e-2)
    ref.eval(), mine.eval()
    with torch.no_grad():
        got, want = c(x), ref(x)
    assert close(got, want, atol=1e-2, rtol=1e-2) and [g.stride() for g in got] == [w.stride() for w in want]
    said = "".join(e.kernels.passes.get("layout", "") for e in entries(c) if e.kernels is not None)
    assert ("channels_last: " in said) == (layout == "channels_last"), said
