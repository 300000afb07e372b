"""What a compiled call in grad mode keeps and checks: the entry holds its parameters'
gradient accumulators (so a call need not create them again), gradients and hooks stay
eager's, a dropped model is still freed, and the grad-mode guard runs first (a model's
no_grad entry misses at its first check in grad mode)."""
import copy
import gc
import weakref

import torch
import torch.nn as nn
from torch.autograd.graph import get_gradient_edge

import tempa
from tempa.capture.cache import MISS


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def setup_function(_):
    tempa.reset()


def _entries(fast):
    return [e for c in fast._tempa_context.caches.values() for e in c.entries]


def _accumulators(out):
    """The AccumulateGrad nodes an output's graph reaches."""
    found, todo = [], [out.grad_fn]
    while todo:
        node = todo.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if type(nxt).__name__ == "AccumulateGrad":
                found.append(nxt)
            else:
                todo.append(nxt)
    return found


def test_the_entry_holds_the_gradient_accumulators_its_outputs_reach():
    model, x = MLP(), torch.randn(4, 6)
    model.fc2.bias.requires_grad_(False)
    fast = tempa.compile(model)
    fast(x)                                  # the output (and its graph) dropped at once
    (entry,) = _entries(fast)
    held = entry.fn.__globals__["___ACC"]
    trained = [p for p in model.parameters() if p.requires_grad]
    assert len(held) == len(trained) == 3   # the frozen bias has none
    assert all(get_gradient_edge(p).node is a for p, a in zip(trained, held))
    out = fast(x)
    assert sorted(map(id, _accumulators(out))) == sorted(map(id, held))
    assert tempa.stats().captures == 1


def test_gradients_and_hooks_match_eager_over_steps():
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    fired = {"eager": 0, "tempa": 0}
    eager.fc1.weight.register_post_accumulate_grad_hook(lambda p: fired.__setitem__("eager", fired["eager"] + 1))
    model.fc1.weight.register_post_accumulate_grad_hook(lambda p: fired.__setitem__("tempa", fired["tempa"] + 1))
    for step in range(3):
        x = torch.randn(4, 6)
        eager(x).square().sum().backward()
        fast(x).square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)   # accumulated over the steps
    assert fired == {"eager": 3, "tempa": 3}
    assert tempa.stats().captures == 1


def test_a_dropped_trained_model_and_its_weights_are_freed():
    refs = []
    for _ in range(2):
        model = MLP()
        fast = tempa.compile(model)
        fast(torch.randn(4, 6)).sum().backward()
        assert _entries(fast)   # captured: the entry held the accumulators until now
        refs.append(weakref.ref(model.fc1.weight))
        del model, fast
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_the_grad_mode_guard_runs_first():
    model, x = MLP(), torch.randn(4, 6)
    fast = tempa.compile(model)
    with torch.no_grad():
        fast(x)
    (no_grad_entry,) = _entries(fast)
    assert no_grad_entry.guards[0][1] == "grad mode is disabled"
    assert no_grad_entry.fn(model, x) is MISS
    assert no_grad_entry.why(model, x) == "grad mode is disabled"
    out = fast(x)                           # grad mode: the second entry, with history
    assert out.requires_grad and tempa.stats().captures == 2
