"""Capture never reads, nor guards, tempa's own bookkeeping.

torch calls tempa's module-registration hook (capture/cache.py, which drops the entries of a
module whose parameters, buffers or submodules are reassigned) from ``register_buffer``,
``add_module`` and ``Module.__setattr__``. A module built in forward reaches it: BERT's
``CrossEntropyLoss()`` registers its ``weight`` buffer. Traced, the hook read the watch
registry, whose lists grow as entries are added, so the guards of every entry failed on
their own call and training ran eagerly, recapturing until the recompile limit.
"""
import torch
import torch.nn as nn

import tempa
from tests.capture.paths import counts
from tests.models.compare import assert_same


class Classifier(nn.Module):
    """A head that builds its loss module in forward, as transformers' models do."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x, labels):
        logits = self.fc2(torch.relu(self.fc1(x)))
        loss_fct = nn.CrossEntropyLoss()      # registers a buffer, a submodule-free module
        head = nn.Sequential(nn.Identity())   # registers a submodule
        return loss_fct(head(logits), labels), logits


def _train(model, run, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    results = []
    for _ in range(steps):
        loss, logits = run(model)
        loss.backward()
        results.append((loss.detach(), logits.detach(),
                        [p.grad.clone() for p in model.parameters()]))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return results


def test_module_built_in_forward_trains_from_one_capture():
    torch.manual_seed(0)
    model = Classifier()
    twin = Classifier()
    twin.load_state_dict(model.state_dict())
    x, labels = torch.randn(4, 8), torch.tensor([0, 2, 1, 2])
    fast = tempa.compile(twin, backend="eager")
    expected = _train(model, lambda m: m(x, labels), 4)
    got = _train(twin, lambda m: fast(x, labels), 4)
    for (loss, logits, grads), (want_loss, want_logits, want_grads) in zip(got, expected):
        assert_same(loss, want_loss)
        assert_same(logits, want_logits)
        for g, w in zip(grads, want_grads):
            assert_same(g, w)
    assert counts() == (1, 0, 0, 0)


class Registers(nn.Module):
    """Registers a buffer on itself in forward: entries that read it must be dropped."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x, grow=False):
        if grow:
            self.register_buffer("scale", self.scale * 2)
        return x * self.scale


def test_registration_on_an_outside_module_runs_eagerly_and_invalidates():
    model = Registers()
    fast = tempa.compile(model, backend="eager")
    x = torch.arange(3.0)
    assert_same(fast(x), x)
    assert counts() == (1, 0, 0, 0)
    assert_same(fast(x, grow=True), x * 2)
    # two breaks: forward's at register_buffer, whose own capture breaks at tempa's hook,
    # which then runs as it is (not captured as a frame of its own)
    assert counts()[1] == 2
    assert_same(fast(x), x * 2)              # tempa's hook dropped the entry that read scale
    assert_same(fast(x, grow=True), x * 4)
    assert_same(fast(x), x * 4)
