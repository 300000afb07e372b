"""In-place updates of inputs that require grad, made under no_grad inside the graph (an
optimizer step: torch.optim runs it under no_grad while the caller's grad mode is on),
compile to kernels: the same tensor objects are written, their versions bumped, nothing
is recorded by autograd. Where autograd would need the graph (an output or a new value
that requires grad) or eager raises (the write made in grad mode), the ATen graph runs."""
import pytest
import torch
import torch.nn as nn

import tempa
from tests.capture.optimizer_steps import step_twins


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
@pytest.mark.parametrize("make", [
    lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=fe),
    lambda p, fe: torch.optim.Adam(p, lr=0.01, foreach=fe),
    lambda p, fe: torch.optim.AdamW(p, lr=0.01, foreach=fe)], ids=["sgd-momentum", "adam", "adamw"])
def test_optimizer_step_runs_as_kernels(make, foreach):
    eager_model, model = _model(), _model()
    eager_opt, opt = make(eager_model.parameters(), foreach), make(model.parameters(), foreach)
    step = tempa.compile(opt.step)
    x = torch.randn(32, 8)
    params = list(model.parameters())
    step_twins(((eager_model, eager_opt, eager_opt.step), (model, opt, step)), x, 5)
    for p, q in zip(eager_model.parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6)
    assert list(model.parameters()) == params                  # the same objects
    assert all(p.is_leaf and p.requires_grad and p.grad_fn is None for p in params)
    s = tempa.stats()
    assert s.aten_fallbacks == 0 and s.kernels_compiled > 0 and s.eager_fallbacks == 0


def test_versions_bumped_and_autograd_sees_the_write():
    w = nn.Parameter(torch.randn(4))

    def update(w, g):
        with torch.no_grad():
            w.sub_(g * 0.1)

    y = (w * 2).sum()        # saves nothing of w: its backward reads no value of w
    z = (w * w).sum()        # saves w
    before = w._version
    tempa.compile(update)(w, torch.ones(4))
    assert w._version > before
    assert tempa.stats().aten_fallbacks == 0 and tempa.stats().kernels_compiled > 0
    y.backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_a_write_in_grad_mode_raises_eagers_error():
    w = nn.Parameter(torch.randn(4))

    def write(w, g):
        w.copy_(g)            # a leaf that requires grad, grad mode on: eager raises

    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        write(w, torch.ones(4))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        tempa.compile(write)(w, torch.ones(4))


def test_a_new_value_that_requires_grad_is_not_compiled_away():
    w = nn.Parameter(torch.randn(4))
    s = torch.zeros(4)

    def accumulate(w, s):
        with torch.no_grad():
            w.mul_(0.5)
        s.add_(w * 3)          # in grad mode: s now has history through w
        return s

    want_s = torch.zeros(4)
    w_eager = nn.Parameter(w.detach().clone())
    accumulate(w_eager, want_s)
    got = tempa.compile(accumulate)(w, s)
    assert got is s and s.requires_grad
    torch.testing.assert_close(s, want_s)
    s.sum().backward()
    torch.testing.assert_close(w.grad, torch.full((4,), 3.0))
