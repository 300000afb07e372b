"""torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False) in captured code: one
operation that keeps only the region's inputs and recomputes the region in the backward
(tempa/capture/checkpoint.py). Counts as torch.compile's: one graph, no break (it captures
the region as its tag_activation_checkpoint operation)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


torch.manual_seed(0)
_LIN1 = torch.nn.Linear(4, 32).double()
_LIN2 = torch.nn.Linear(32, 4).double()


def _block(x, scale=1.0):
    # the (3, 32) hidden activation is what checkpointing should not keep
    return _LIN2(torch.tanh(_LIN1(x)).sin()) * scale


def _checkpointed(x):
    return checkpoint(_block, x.sin(), use_reentrant=False, scale=2.0).cos().sum()


def _plain(x):
    return _block(x.sin(), scale=2.0).cos().sum()


def _values_and_grads(fn, x, params=(), seed=None):
    x = x.detach().clone().requires_grad_()
    for p in params:
        p.grad = None
    if seed is not None:
        torch.manual_seed(seed)
    out = fn(x)
    out.backward()
    return out, [x.grad, *(p.grad for p in params)]


def _params():
    return [*_LIN1.parameters(), *_LIN2.parameters()]


def _assert_matches_eager(fast, fn, x, params=(), seed=None):
    for _ in range(2):
        got, got_grads = _values_and_grads(fast, x, params, seed)
        want, want_grads = _values_and_grads(fn, x, params, seed)
        torch.testing.assert_close(got, want)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w)


def _checkpoint_ops(fast) -> list:
    return [n.target for n in tempa.entries(fast)[0].graph.graph.nodes
            if "checkpoint_" in str(n.target)]


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_checkpoint_matches_eager_values_and_gradients(backend):
    x = torch.randn(3, 4, dtype=torch.float64)
    fast = tempa.compile(_checkpointed, backend=backend, fullgraph=True)
    _assert_matches_eager(fast, _checkpointed, x, _params())
    assert _counts() == (1, 0, 0)
    (op,) = _checkpoint_ops(fast)
    assert op.namespace == "tempa_fn"


def _saved_in(run) -> list:
    """(dtype, numel) of each tensor autograd saves while ``run`` runs."""
    saved = []

    def pack(t):
        saved.append((t.dtype, t.numel()))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return saved


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_checkpoint_recomputes_the_region_in_the_backward(backend):
    """The backward recomputes the region: it saves tensors of its own there (the
    recomputed region's activations, while differentiating it), which a backward that reads
    kept activations never does."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    saved_in_backward = {}
    for fn in (_checkpointed, _plain):
        tempa.reset()
        fast = tempa.compile(fn, backend=backend, fullgraph=True)
        fast(x).backward()
        out = fast(x)
        saved_in_backward[fn] = _saved_in(out.backward)
    assert saved_in_backward[_plain] == []
    assert (torch.float64, 3 * 32) in saved_in_backward[_checkpointed]


def test_checkpoint_keeps_no_activation_of_the_region_eager_backend():
    """The forward keeps the region's inputs (x.sin(), the parameters), the generator
    state and its output (cos's backward reads it), never the (3, 32) hidden activations."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    kept = {}
    for fn in (_checkpointed, _plain):
        tempa.reset()
        fast = tempa.compile(fn, backend="eager", fullgraph=True)
        fast(x)
        assert tempa.stats().captures == 1   # (fails with capture off)
        kept[fn] = [s for s in _saved_in(lambda: fast(x)) if s[0] == torch.float64]
    assert (torch.float64, 3 * 32) in kept[_plain]
    assert (torch.float64, 3 * 32) not in kept[_checkpointed]
    hidden_bytes = sum(n for _, n in kept[_plain]) - sum(n for _, n in kept[_checkpointed])
    assert hidden_bytes >= 2 * 3 * 32


def _joint_saved_values(fast) -> list:
    joint = tempa.entries(fast)[0].kernels.passes["joint"]
    outs = list(joint.fw.graph.output_node().args[0])
    return [n.meta["traced_meta"] for n in outs[len(outs) - joint.num_saved:]]


def test_checkpoint_keeps_no_activation_of_the_region_tempa_backend():
    """What the compiled joint graph saves for its backward (besides its inputs): with
    checkpoint no (3, 32) activation of the region, without it at least one."""
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    wide = {}
    for fn in (_checkpointed, _plain):
        tempa.reset()
        fast = tempa.compile(fn, fullgraph=True)
        fast(x).backward()
        wide[fn] = [m for m in _joint_saved_values(fast) if tuple(m.shape) == (3, 32)]
    assert wide[_plain] and not wide[_checkpointed]


def _dropout_block(t):
    return F.dropout(_LIN1(t), 0.5, training=True).tanh()


def _checkpointed_dropout(x):
    return (checkpoint(_dropout_block, x, use_reentrant=False) * 3).sum()


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_dropout_inside_checkpoint_recomputes_the_forwards_mask(backend):
    """preserve_rng_state (the default): the recomputation draws the forward's mask again,
    so the gradients are those of the mask that made the output, as in eager."""
    x = torch.randn(3, 4, dtype=torch.float64)
    fast = tempa.compile(_checkpointed_dropout, backend=backend, fullgraph=True)
    _assert_matches_eager(fast, _checkpointed_dropout, x, list(_LIN1.parameters()), seed=7)
    assert _counts() == (1, 0, 0)
    # the generators stand where eager's leave them after the forward and the backward
    torch.manual_seed(3)
    _values_and_grads(fast, x)
    after_compiled = torch.rand(4)
    torch.manual_seed(3)
    _values_and_grads(_checkpointed_dropout, x)
    torch.testing.assert_close(after_compiled, torch.rand(4))


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_double_backward_through_a_checkpoint(backend):
    def f(x):
        return checkpoint(_block, x, use_reentrant=False).pow(2).sum()

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    results = []
    for fn in (tempa.compile(f, backend=backend, fullgraph=True), f):
        (grad,) = torch.autograd.grad(fn(x), x, create_graph=True)
        results.append((grad, *torch.autograd.grad(grad.sum(), x)))
    torch.testing.assert_close(results[0], results[1])
    assert _counts() == (1, 0, 0)


def test_checkpoint_outputs_keep_eager_flags():
    def f(x):
        return checkpoint(lambda t: (_LIN1(t), _LIN1(t).detach() * 2, _LIN1(t).argmax(1), 3),
                          x, use_reentrant=False)

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    fast = tempa.compile(f, fullgraph=True)
    got, want = fast(x), f(x)
    assert got[3] == want[3] == 3
    torch.testing.assert_close(got[:3], want[:3])
    assert [t.requires_grad for t in got[:3]] == [t.requires_grad for t in want[:3]]
    assert _checkpoint_ops(fast)


def test_checkpoint_without_grad_is_the_plain_call():
    x = torch.randn(3, 4, dtype=torch.float64)
    fast = tempa.compile(_checkpointed, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), _checkpointed(x))
    assert _counts() == (1, 0, 0)
    assert not _checkpoint_ops(fast)   # eager's checkpoint keeps nothing without grad either


def test_checkpoint_returning_a_view_of_its_input_is_the_plain_call():
    def f(x):
        return checkpoint(lambda t: t.view(-1), x, use_reentrant=False)

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    base = x * 1
    fast = tempa.compile(lambda t: f(t), fullgraph=True)
    got = fast(base)
    assert got._base is base and f(base)._base is base
    assert _counts() == (1, 0, 0)


_LOG = []


def test_checkpoint_of_a_function_with_a_side_effect_runs_eagerly_by_name():
    """Eager's recomputation runs the function again in the backward (the side effect
    twice): one operation could not, so checkpoint runs eagerly, as under torch.compile."""
    def f(x):
        def logged(t):
            _LOG.append(1)
            return _LIN1(t) * 2
        return checkpoint(logged, x, use_reentrant=False).sum()

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(tempa.GraphBreakError, match="checkpoint changes state outside the call"):
        tempa.compile(f, fullgraph=True)(x)
    tempa.reset()
    for fn in (tempa.compile(f), f):
        _LOG.clear()
        fn(x).backward()
        assert len(_LOG) == 2
    assert tempa.stats().graph_breaks == 1


def test_reentrant_checkpoint_matches_eager():
    def f(x):
        return checkpoint(_block, x.sin(), use_reentrant=True).cos().sum()

    x = torch.randn(3, 4, dtype=torch.float64)
    _assert_matches_eager(tempa.compile(f), f, x, _params())
    assert tempa.stats().graph_breaks == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_dropout_inside_checkpoint_on_cuda_recomputes_the_forwards_mask(backend):
    """The CUDA generator of the region's inputs is kept and restored too."""
    lin = torch.nn.Linear(4, 32).cuda()

    def f(x):
        return checkpoint(lambda t: F.dropout(lin(t), 0.5, training=True).tanh(), x,
                          use_reentrant=False).sum()

    x = torch.randn(3, 4, device="cuda")
    fast = tempa.compile(f, backend=backend, fullgraph=True)
    _assert_matches_eager(fast, f, x, list(lin.parameters()), seed=7)
    assert _counts() == (1, 0, 0)
