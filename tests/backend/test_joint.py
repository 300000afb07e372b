"""The joint forward/backward trace: which backward formulas it records, what the forward
saves for the backward, and where the backward recomputes forward values."""
import torch
import torch.fx as fx
import torch.nn.functional as F

import tempa
from tempa.backend.lower.decomps import table
from tempa.backend.lower.joint import trace_training

from .helpers import compile_fn

aten = torch.ops.aten


def _joint(fn, *inputs):
    return trace_training(fx.symbolic_trace(fn), list(inputs), table())


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _saved(joint):
    outs = list(joint.fw.graph.output_node().args[0])
    return outs[joint.num_outputs + len(joint.mutated):]


def _cross_entropy(h, w, target):
    return F.cross_entropy(h @ w, target)


def _ce_inputs(rows=6, vocab=40):
    torch.manual_seed(0)
    h = torch.randn(rows, 8, requires_grad=True)
    w = torch.randn(8, vocab, requires_grad=True)
    return h, w, torch.randint(0, vocab, (rows,))


def test_cross_entropy_backward_is_log_softmax_formula():
    """log_softmax stays whole for autograd: its backward is grad - exp(out) * sum(grad). Through
    its decomposition, autograd also sent a gradient into the row max (ties counted: an
    amax and an equality test over every logit), five passes over a GPT's logits."""
    h, w, target = _ce_inputs()
    joint = _joint(_cross_entropy, h, w, target)
    bw_ops = {n.target for n in _calls(joint.bw)}
    assert aten.amax.default not in bw_ops and aten.eq.Tensor not in bw_ops, bw_ops


def test_cross_entropy_saves_no_float_copy_of_the_logits():
    """The log-probabilities (rows x vocab) are recomputed in the backward from the logits and
    two per-row values instead of saved: only one (rows, vocab) tensor is saved."""
    h, w, target = _ce_inputs()
    joint = _joint(_cross_entropy, h, w, target)
    wide = [n for n in _saved(joint) if tuple(n.meta["traced_meta"].shape) == (6, 40)]
    assert len(wide) == 1, [n.format_node() for n in _saved(joint)]


def test_cross_entropy_gradients_match_eager():
    h, w, target = _ce_inputs()
    c = compile_fn(_cross_entropy, h, w, target)
    c(h, w, target).backward()
    got = h.grad, w.grad
    h.grad = w.grad = None
    _cross_entropy(h, w, target).backward()
    torch.testing.assert_close(got[0], h.grad)
    torch.testing.assert_close(got[1], w.grad)


def test_recompute_only_when_it_saves_memory():
    """h = x + x @ w1 with x saved anyway: recomputing h means saving x @ w1 instead, the same
    size, so h itself is saved (equal swaps made a transformer's residual stream recomputed
    layer after layer at the start of the backward)."""
    def f(x, w1, w2):
        h = x + x @ w1
        return (h @ w2).sum()
    torch.manual_seed(0)
    joint = _joint(f, torch.randn(4, 8), torch.randn(8, 8, requires_grad=True),
                   torch.randn(8, 8, requires_grad=True))
    assert any(n.op == "call_function" and n.target is aten.add.Tensor for n in _saved(joint))
    assert not any(n.target is aten.add.Tensor and not n.meta.get("bw") for n in _calls(joint.bw))


def test_recompute_when_its_inputs_are_kept_anyway():
    """y = tanh(x @ w) * 2: tanh's backward keeps t = tanh(...), so y is recomputed from it."""
    def f(x, w1, w2):
        t = torch.tanh(x @ w1)
        return ((t * 2) @ w2).sum()
    torch.manual_seed(0)
    joint = _joint(f, torch.randn(4, 8), torch.randn(8, 8, requires_grad=True),
                   torch.randn(8, 8, requires_grad=True))
    assert not any(n.target is aten.mul.Tensor for n in _saved(joint))
    assert any(n.target is aten.mul.Tensor and not n.meta.get("bw") for n in _calls(joint.bw))


def test_recomputed_values_come_just_before_their_first_use(monkeypatch):
    """Each forward value the backward recomputes is placed right before the backward node that
    first reads it, not at the backward's start (where the GPU scheduler put every layer's
    recomputed values into one launch)."""
    import tempa
    import tempa.backend.entry as entry
    from tests.models import gpt as G
    joints = []

    def recording(*args):
        joints.append(trace_training(*args))
        return joints[-1]
    monkeypatch.setattr(entry, "trace_training", recording)
    torch.manual_seed(0)
    cfg = G.small_config()
    cfg.n_layer = 3
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    tempa.reset()
    tempa.compile(G.GPT(cfg))(idx, idx)[1].backward()
    joint, = joints
    nodes = _calls(joint.bw)
    recomputed = [n for n in nodes if not n.meta.get("bw")]
    assert recomputed
    position = {n: i for i, n in enumerate(nodes)}
    for n in recomputed:
        first = min(position[u] for u in n.users if u in position)
        between = nodes[position[n] + 1:first]
        assert all(not m.meta.get("bw") for m in between), n.format_node()


def test_output_with_other_strides_on_size_one_dims_is_not_copied():
    """A view of a matmul result with a size-1 dim (GPT logits at batch 1): handed out with
    eager's strides as a view of the matmul's buffer, not copied by a kernel."""
    def f(x, w):
        return (x @ w).view(1, 64, 256)
    torch.manual_seed(0)
    x, w = torch.randn(64, 128), torch.randn(128, 256)
    c = compile_fn(f, x, w)
    out, ref = c(x, w), f(x, w)
    torch.testing.assert_close(out, ref)
    assert out.stride() == ref.stride()
    assert c.tempa_info.kernel_count == 0, c.tempa_info.fusion_report


def test_a_recomputed_value_reading_a_returned_output_gets_that_output_saved():
    # y is returned and also the input of y.float(), which the backward recomputes (cheaper
    # than saving the float32 copy): y must then be saved too. It was not (a returned value
    # "costs nothing to keep"), and building the backward failed with a KeyError, so the
    # whole training graph ran with ATen calls (an HF Llama step under bf16 autocast).
    import warnings

    def f(x, w):
        y = (x * w).to(torch.bfloat16)
        return y, torch.sin(y.float()).sum()

    x, w = torch.randn(32, 32, requires_grad=True), torch.randn(32, 32, requires_grad=True)
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    tempa.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # a failed compile warns and runs ATen calls
        y, s = tempa.compile(f)(x, w)
    (s + y.float().sum()).backward()
    ye, se = f(xe, we)
    (se + ye.float().sum()).backward()
    assert torch.equal(y, ye)
    torch.testing.assert_close(x.grad, xe.grad)
    torch.testing.assert_close(w.grad, we.grad)
    assert tempa.stats().kernels_compiled > 0


def test_cpu_keeps_a_gelu_output_rather_than_recompute_its_erf():
    """GELU between two Linears on the CPU: its output (the second Linear's input) is saved, as
    eager saves it, not recomputed in the backward from the GELU's input: that is an erf per
    element, where keeping costs nothing the forward does not write anyway."""
    def f(x, w1, w2):
        return (F.gelu(x @ w1) @ w2).sum()
    torch.manual_seed(0)
    joint = _joint(f, torch.randn(4, 8), torch.randn(8, 16, requires_grad=True),
                   torch.randn(16, 8, requires_grad=True))
    recomputed = [n for n in _calls(joint.bw) if not n.meta.get("bw")]
    assert not any(n.target is aten.erf.default for n in recomputed), [n.format_node() for n in recomputed]
    saved_ops = {n.target for n in _saved(joint)}
    assert aten.mul.Tensor in saved_ops, [n.format_node() for n in _saved(joint)]
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 16, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    ref = [t.detach().clone().requires_grad_() for t in (w1, w2)]
    f(x, *ref).backward()
    tempa.compile(f)(x, w1, w2).backward()
    for a, b in zip((w1, w2), ref):
        torch.testing.assert_close(a.grad, b.grad)
