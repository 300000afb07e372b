"""Autograd beyond one backward through compiled code: double backward (Hessians, gradient
penalties), forward-mode AD and torch.func transforms (vmap, jvp, grad). Each gives eager's
values or a clear error, never zeros or a dropped tangent."""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn

import tempa

from .helpers import compile_fn


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _sin_exp(x):
    return (x.sin() * x.exp()).sum()


def _critic():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _same(a, b, atol=1e-5):
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and
                                      torch.allclose(x, y, atol=atol)) for x, y in zip(a, b))


# -- double backward ------------------------------------------------------------------------

def test_hessian_through_compiled_code_is_eagers():
    x = torch.tensor([0.5, -1.0, 2.0])
    eager = torch.autograd.functional.hessian(_sin_exp, x)
    compiled = torch.autograd.functional.hessian(tempa.compile(_sin_exp), x)
    assert torch.allclose(compiled, eager, atol=1e-5)
    assert compiled.abs().sum() > 0


def test_gradient_penalty_trains_like_eager():
    model = _critic()
    fast = tempa.compile(model)
    x = torch.randn(5, 4, requires_grad=True)

    def step(f):
        model.zero_grad(set_to_none=True)
        g, = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        assert g.requires_grad
        penalty = (g.norm(2, dim=1) - 1).pow(2).mean()
        penalty.backward()
        return penalty.detach(), _grads(model)

    pe, ge = step(model)
    pt, gt = step(fast)
    assert torch.allclose(pe, pt, atol=1e-6) and _same(ge, gt)
    assert tempa.stats().kernels_compiled > 0     # the first backward is compiled code


def test_first_order_backward_still_runs_the_compiled_kernels():
    # only a backward with grad mode on (create_graph) recomputes; a plain one does not
    fast = tempa.compile(_sin_exp)
    x = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    out = fast(x)
    ctx = out.grad_fn
    out.backward()
    assert torch.allclose(x.grad, (x.sin() + x.cos()).detach() * x.exp().detach())
    assert type(ctx).__name__ == "TempaCompiledFunctionBackward"


def test_double_backward_with_batchnorm_updates_running_stats_once():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh())
    copy = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh())
    copy.load_state_dict(eager.state_dict())
    fast = tempa.compile(copy)
    x = torch.randn(5, 4, requires_grad=True)
    for module, f in ((eager, eager), (copy, fast)):
        g, = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        g.square().sum().backward()
    assert torch.allclose(eager[1].running_mean, copy[1].running_mean)
    assert copy[1].num_batches_tracked.item() == 1
    assert _same(_grads(eager), _grads(copy))


def test_double_backward_through_random_ops_raises_clearly():
    # a recomputed dropout mask is not the forward's: an error, never a wrong gradient
    torch.manual_seed(0)
    fast = tempa.compile(nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5), nn.Tanh()))
    x = torch.randn(5, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(fast(x).sum(), x, create_graph=True)


def test_double_backward_on_an_fx_graph_with_attribute_parameters():
    # tempa_backend on a torch.fx-traced module: the parameters are get_attr tensors
    model = _critic()
    x = torch.randn(3, 4, requires_grad=True)
    compiled = compile_fn(model, x)
    ge, = torch.autograd.grad(model(x).sum(), x, create_graph=True)
    gt, = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    he = torch.autograd.grad(ge.square().sum(), model[0].weight)[0]
    ht = torch.autograd.grad(gt.square().sum(), model[0].weight)[0]
    assert torch.allclose(ge, gt, atol=1e-6) and torch.allclose(he, ht, atol=1e-5)


# -- forward-mode AD and torch.func transforms ----------------------------------------------

def _sin3(x):
    return (x * 3).sin()


def test_forward_ad_keeps_the_tangent_then_kernels_run_again():
    fast = tempa.compile(_sin3)
    x = torch.tensor([0.1, 0.2, 0.3])
    fast(x)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fast(fwAD.make_dual(x, torch.ones(3)))).tangent
    assert tangent is not None and torch.allclose(tangent, 3 * torch.cos(3 * x))
    assert tempa.stats().eager_fallbacks == 1
    info = tempa.entries(fast)[0].kernels
    assert any("forward-mode AD" in n for n in info.notes)
    assert torch.allclose(fast(x), _sin3(x)) and info.fallback_reason is None


def test_forward_ad_on_the_training_path():
    fast = tempa.compile(_sin3)
    x = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
    fast(x)
    with fwAD.dual_level():
        y = fast(fwAD.make_dual(x, torch.ones(3)))
        tangent = fwAD.unpack_dual(y).tangent
    assert torch.allclose(tangent, 3 * torch.cos(3 * x)) and y.requires_grad


def _sum_sin2(x):
    return (x * 2).sin().sum()


@pytest.mark.parametrize("plain_call_first", [True, False])
def test_vmap_over_compiled_code(plain_call_first):
    x = torch.randn(4, 3)
    fast = tempa.compile(_sum_sin2)
    if plain_call_first:
        fast(x[0])
    assert torch.allclose(torch.func.vmap(fast)(x), torch.func.vmap(_sum_sin2)(x))
    # outside the transform the graph is compiled code (captured under vmap: built now)
    assert torch.allclose(fast(x[1]), _sum_sin2(x[1]))
    info = tempa.entries(fast)[0].kernels
    assert info.fallback_reason is None and info.kernel_count > 0


@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap_grad"])
def test_torch_func_transforms_over_compiled_code(transform):
    x = torch.randn(4, 3)
    run = {
        "grad": lambda f: torch.func.grad(f)(x[0]),
        "jvp": lambda f: torch.func.jvp(f, (x[0],), (torch.ones(3),))[1],
        "vmap_grad": lambda f: torch.func.vmap(torch.func.grad(f))(x),
    }[transform]
    fast = tempa.compile(_sum_sin2)
    fast(x[0])
    assert torch.allclose(run(fast), run(_sum_sin2), atol=1e-6)


# -- compiled optimizer steps ---------------------------------------------------------------

@pytest.mark.parametrize("backend", ["tempa", "eager"])
@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=0.01),
], ids=["sgd_momentum", "adam"])
def test_compiled_optimizer_step_matches_eager_over_ten_steps(backend, make):
    # step() switches grad mode off with a plain torch.set_grad_enabled(False) and then
    # breaks the graph: the rest must run with grad mode off, as in eager
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    ref = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    ref.load_state_dict(model.state_dict())
    opt, ref_opt = make(model.parameters()), make(ref.parameters())
    step = tempa.compile(opt.step, backend=backend)
    for _ in range(10):
        x = torch.randn(5, 4)
        for module, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            module(x).square().mean().backward()
        step()
        ref_opt.step()
        assert torch.is_grad_enabled()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p, q, atol=1e-6)
    # captured whole (the state's creation on step 1 is replayed after its graph), with
    # the grad-mode switch and the state read on step 2 (one recompile) modelled
    s = tempa.stats()
    assert (s.captures, s.recompiles, s.graph_breaks, s.eager_fallbacks) == (2, 1, 0, 0)


def _switch_off_then_break(x):
    torch.set_grad_enabled(False)
    y = x * 2
    print("break")
    return y * 3


@pytest.mark.parametrize("backend", ["tempa", "eager"])
def test_plain_set_grad_enabled_before_a_graph_break_holds_after_it(backend):
    x = torch.randn(3, requires_grad=True)
    fast = tempa.compile(_switch_off_then_break, backend=backend)
    try:
        out = fast(x)
        assert not torch.is_grad_enabled()       # eager leaves it off too
    finally:
        torch.set_grad_enabled(True)
    assert not out.requires_grad and torch.allclose(out, x.detach() * 6)
    assert tempa.stats().graph_breaks == 1


# -- the training/inference choice and grad mode ---------------------------------------------

def test_fx_graph_follows_parameters_frozen_and_unfrozen():
    # tempa_backend on a torch.fx graph: the parameters are get_attr tensors no guard sees
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    x = torch.randn(5, 4)
    compiled = compile_fn(model, x)
    compiled(x).sum().backward()
    assert model[0].weight.grad is None and model[2].weight.grad is not None
    model[0].requires_grad_(True)
    model.zero_grad(set_to_none=True)
    compiled(x).sum().backward()
    got = _grads(model)
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    assert _same(got, _grads(model))
    model.requires_grad_(False)
    assert not compiled(x).requires_grad


def _gather_under_no_grad(x, idx):
    with torch.no_grad():
        y = torch.gather(x, 0, idx)
    return y * x.sum()


def test_grad_mode_survives_an_error_in_a_graph_run_eagerly():
    # under vmap the graph runs with ATen ops; the gather raises inside its no_grad block
    fast = tempa.compile(_gather_under_no_grad)
    x = torch.randn(4)
    fast(x, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="out of bounds"):
        torch.func.vmap(fast, in_dims=(None, 0))(x, torch.tensor([[0, 1], [0, 9]]))
    assert torch.is_grad_enabled()
