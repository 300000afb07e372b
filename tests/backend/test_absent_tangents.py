"""A training graph's backward when the loss does not use some of its outputs.

Autograd gives the compiled node no gradient for such an output (an LM head's logits when
the model also returns its loss). The node takes None there, not a materialized zero tensor,
and runs a backward compiled for those tangents being absent (lower/absent.py, autograd.py
``_AbsentTangents``), recorded on the backward's info as ``absent_tangents``. Each behaviour
is checked on both autograd paths (the native node and ``autograd.Function``), against eager
in float32 and float64."""
import copy

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

import tempa
from tempa import counters
from tempa.backend import autograd as backend_autograd
from tempa.backend.gpu import compile as gc
from tempa.backend.lower.absent import without_tangents
from tempa.backend.lower.decomps import table
from tempa.backend.lower.joint import trace_training

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


class LMHead(nn.Module):
    """Returns (logits, loss), as a HF causal LM given labels does."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x, y):
        logits = self.head(torch.tanh(self.body(x)))
        return logits, F.cross_entropy(logits, y)


def _lm(dtype=torch.float32):
    torch.manual_seed(0)
    model = LMHead().to(dtype)
    return model, torch.randn(6, 16, dtype=dtype), torch.randint(0, 10, (6,))


def _infos(fast):
    info = tempa.entries(fast)[0].compiled.tempa_info
    return info.forward, info.backward


def _assert_grads_equal(model, eager, tol):
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_loss_backward_runs_the_backward_without_the_logits_tangent(autograd_path, dtype, tol):
    model, x, y = _lm(dtype)
    eager = copy.deepcopy(model)
    before = counters.snapshot()
    fast = tempa.compile(model)
    for _ in range(2):
        logits, loss = fast(x, y)
        loss.backward()
        ref_logits, ref_loss = eager(x, y)
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
        _assert_grads_equal(model, eager, tol)
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
    fw, bw = _infos(fast)
    assert fw.autograd == autograd_path
    assert list(bw.absent_tangents) == [(0,)]          # output 0, the logits, got no gradient
    variant = bw.absent_tangents[(0,)]
    # a loss beside its logits: the backward for every tangent was never needed, nor compiled
    info = tempa.entries(fast)[0].compiled.tempa_info
    assert bw.passes == {} and bw.kernel_count == 0
    assert info.kernel_count == fw.kernel_count + variant.kernel_count > fw.kernel_count
    assert counters.snapshot().kernels_compiled - before.kernels_compiled == info.kernel_count
    joint = info.passes["joint"]
    full, folded = joint.bw, variant.passes["aten"]
    diff = joint.diff_outputs
    inputs = [n.name for n in full.graph.nodes if n.op == "placeholder"]
    logits_tangent = inputs[len(inputs) - len(diff) + diff.index(0)]
    assert [n.name for n in folded.graph.nodes if n.op == "placeholder"] == \
        [name for name in inputs if name != logits_tangent]
    assert not any(n.target is aten.zeros.default for n in folded.graph.nodes)   # folded, not filled
    assert len(folded.graph.nodes) < len(full.graph.nodes)


def test_tangent_present_on_some_calls_and_absent_on_others(autograd_path):
    model, x, y = _lm()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    variants = []
    for uses in ("loss", "both", "loss", "logits", "both", "logits"):
        for m, fn in ((model, fast), (eager, eager)):
            logits, loss = fn(x, y)
            total = {"loss": loss, "logits": logits.pow(2).mean(),
                     "both": loss + logits.pow(2).mean()}[uses]
            total.backward()
        _assert_grads_equal(model, eager, 1e-5)
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        variants.append(dict(_infos(fast)[1].absent_tangents))
        # the backward for every tangent: compiled by the first call that gave both
        assert bool(_infos(fast)[1].passes) == (uses == "both" or len(variants) > 2)
    # compiled when first needed, then kept: logits absent (0,), loss absent (1,)
    assert [list(v) for v in variants] == [[(0,)], [(0,)], [(0,)], [(0,), (1,)], [(0,), (1,)],
                                           [(0,), (1,)]]
    assert variants[-1][(0,)] is variants[0][(0,)]
    # the loss's backward (where(mask, g, 0), scattered into new_zeros) folds away whole
    assert not any(n.target is aten.zeros.default
                   for n in variants[-1][(1,)].passes["aten"].graph.nodes)


def test_an_input_reached_only_through_an_unused_output_gets_no_gradient(autograd_path):
    """As in eager: no gradient reaches head ``b``'s parameters, so they keep ``grad`` None
    (a materialized zero tangent gave them zero tensors)."""
    torch.manual_seed(0)

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.base, self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 3)

        def forward(self, x):
            h = F.relu(self.base(x))
            return self.a(h), self.b(h)

    model = TwoHeads()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    x = torch.randn(5, 8)
    fast(x)[0].sum().backward()
    eager(x)[0].sum().backward()
    _assert_grads_equal(model, eager, 1e-5)
    assert model.b.weight.grad is None and model.b.bias.grad is None
    assert model.a.weight.grad is not None


def test_double_backward_without_a_gradient_for_one_output(autograd_path):
    """create_graph recomputes with ATen ops (autograd.py): only the outputs that got a
    gradient are differentiated again."""
    def f(x, w):
        return (x * w).sin(), (x + w).cos()

    torch.manual_seed(0)
    x0, w0 = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    grads = []
    fast = tempa.compile(f)
    for fn in (fast, f):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y, _ = fn(x, w)
        (g,) = torch.autograd.grad(y.sum(), w, create_graph=True)
        g.pow(2).sum().backward()
        grads.append((g.detach(), x.grad, w.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the compiled backward's check of the recomputation ran the variant without output 1
    assert list(_infos(fast)[1].absent_tangents) == [(1,)]


def test_a_variant_that_cannot_be_compiled_gives_the_full_backward_zeros(autograd_path, monkeypatch):
    def refuse(bw, absent):
        raise RuntimeError("refused for the test")
    monkeypatch.setattr(backend_autograd, "without_tangents", refuse)
    model, x, y = _lm()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    fast(x, y)[1].backward()
    eager(x, y)[1].backward()
    _assert_grads_equal(model, eager, 1e-5)
    assert _infos(fast)[1].absent_tangents == {(0,): "RuntimeError: refused for the test"}


# -- the fold itself, on graphs ------------------------------------------------------------

def _backward_of(f, *inputs):
    joint = trace_training(fx.symbolic_trace(f), list(inputs), table())
    return joint, len(joint.saved_inputs) + joint.num_saved


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_zero_minus_a_gradient_is_its_negation_and_a_broadcast_sum_is_filled():
    """``0 - g`` folds to ``neg(g)``; ``0 + g`` where the sum broadcasts has no metadata of
    its own to fold to: the zero is materialized (aten.zeros) and the add stays."""
    def f(a, b):
        s = a * 2.0
        return s, s * 3.0, b + 1.0

    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    joint, n_fixed = _backward_of(f, a, b)
    full = joint.bw
    k = joint.diff_outputs.index(0)
    folded = without_tangents(full, {n_fixed + k})
    assert len(_ops(folded)) < len(_ops(full))
    outs = next(n for n in folded.graph.nodes if n.op == "output").args[0]
    assert len(outs) == len(joint.grad_inputs) and all(o is not None for o in outs)

    # every tangent absent but b's: a's gradient is no gradient
    others = {n_fixed + joint.diff_outputs.index(i) for i in (0, 1)}
    folded = without_tangents(full, others)
    outs = next(n for n in folded.graph.nodes if n.op == "output").args[0]
    grads = dict(zip(joint.grad_inputs, outs))
    assert grads[0] is None and grads[1] is not None

    def g(a, b):
        return a.sum(0), a * b       # a's gradient: expand(g0) + g1 * b; with g1 absent
    joint, n_fixed = _backward_of(g, a, b)
    folded = without_tangents(joint.bw, {n_fixed + joint.diff_outputs.index(1)})
    assert aten.mul.Tensor not in _ops(folded)


def test_sub_with_an_absent_first_term_is_a_negation():
    g = fx.Graph()
    t0, t1 = g.placeholder("t0"), g.placeholder("t1")
    from tempa.backend.lower.trace import TracedMeta
    for t in (t0, t1):
        t.meta["traced_meta"] = TracedMeta((3,), (1,), 0, torch.float32)
    d = g.call_function(aten.sub.Tensor, (t0, t1))
    d.meta["traced_meta"] = t0.meta["traced_meta"]
    g.output((d,))
    folded = without_tangents(fx.GraphModule(torch.nn.Module(), g), {0})
    assert _ops(folded) == [aten.neg.default]
    x = torch.randn(3)
    torch.testing.assert_close(folded(x)[0], -x)


def test_the_variant_renders_as_triton_kernels():
    """The GPU target compiles the same folded graph (text only here: no GPU needed); it has
    one input fewer than the full backward and no kernel reads a tangent of the logits'
    size."""
    model, x, y = _lm()
    gm = fx.symbolic_trace(lambda x, y, w1, b1, w2, b2: (
        lambda logits: (logits, F.cross_entropy(logits, y)))(
            F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2)))
    params = [p.detach().requires_grad_() for p in model.parameters()]
    joint = trace_training(gm, [x, y, *params], table())
    n_fixed = len(joint.saved_inputs) + joint.num_saved
    n_bw = n_fixed + len(joint.diff_outputs)
    k = joint.diff_outputs.index(0)
    folded = without_tangents(joint.bw, {n_fixed + k})
    plan = gc.plan_graph(folded, len(joint.grad_inputs), [], n_bw - 1, "backward", "bz0_")
    full = gc.plan_graph(joint.bw, len(joint.grad_inputs), [], n_bw, "backward", "b_")
    kernels = [it[1] for it in plan.items if isinstance(it, tuple)]
    assert kernels and all("tl.load" in kc.body for kc in kernels)
    assert len(plan.lowered.inputs) == len(full.lowered.inputs) - 1
    tangent = full.lowered.inputs[n_fixed + k]
    assert tuple(tangent.sizes) == (6, 10)
    assert not any(b is not None and tuple(b.sizes) == (6, 10) for b in plan.lowered.inputs[n_fixed:])


def test_shape_generic_training_gives_zeros_and_builds_no_variant(autograd_path):
    """A shape-generic backward has no variants (one would need the grid traced again):
    autograd gives the generic backward zeros, of each call's size."""
    model, _, _ = _lm()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    torch.manual_seed(2)
    for b in (6, 7, 9, 12):
        x, y = torch.randn(b, 16), torch.randint(0, 10, (b,))
        fast(x, y)[1].backward()
        eager(x, y)[1].backward()
        _assert_grads_equal(model, eager, 1e-5)
    infos = [e.compiled.tempa_info for e in tempa.entries(fast)]
    generic = [i for i in infos if i.dynamic.startswith("generic")]
    assert generic and all(i.backward.absent_tangents == {} for i in generic)
