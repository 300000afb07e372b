"""A compiled training graph's outputs get their history from tempa's native autograd node
(runtime/nativeautograd.py) where the extension is built, from an ``autograd.Function``
otherwise; both give eager's gradients, errors and autograd metadata. Each behaviour is
checked on both paths (``autograd_path`` fixture), and which path ran is asserted."""
import copy
import logging
import weakref

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.runtime import extension, nativeautograd



@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _forward_info(compiled):
    return tempa.entries(compiled)[0].compiled.tempa_info.forward


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), torch.randn(8, 32)


def _grads(module):
    return [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def test_mlp_gradients_and_output_metadata_are_eagers(autograd_path):
    model, x = _mlp()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    out, ref = fast(x), eager(x)
    assert _forward_info(fast).autograd == autograd_path
    assert type(out.grad_fn).__name__ == "TempaCompiledFunctionBackward"
    assert isinstance(out.grad_fn, torch.autograd.function.BackwardCFunction) == (autograd_path != "native")
    assert out.requires_grad and not out.is_leaf and out._base is None
    assert [f for f, _ in out.grad_fn.next_functions][1:] == \
        [p.grad_fn or p.view_as(p).grad_fn.next_functions[0][0] for p in model.parameters()]
    torch.testing.assert_close(out, ref)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    for g, want in zip(_grads(model), _grads(eager)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)
    assert x.grad is None


def test_native_allocator_and_node_ran_when_the_extension_is_ready():
    if nativeautograd.module() is None:
        pytest.skip("the native autograd extension cannot be built here")
    model, x = _mlp()
    fast = tempa.compile(model)
    fast(x)
    info = _forward_info(fast)
    assert info.autograd == "native" and info.allocator == "extension"
    with torch.no_grad():
        fast(x)
    assert tempa.entries(fast)[0].compiled.tempa_info.inference.allocator == "extension"


def test_unbuildable_extension_falls_back_to_autograd_function_and_says_so(monkeypatch, caplog):
    def no_compiler():
        raise RuntimeError("C++ compiler 'nope' not found")
    monkeypatch.setattr(nativeautograd, "_extension", extension.BuiltOnce(
        no_compiler, "native autograd node unavailable, using autograd.Function", "test"))
    model, x = _mlp()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    with caplog.at_level(logging.INFO, logger="tempa.perf"):
        assert nativeautograd.module() is None    # the build fails (in the background too)
        out = fast(x)
    assert any("native autograd node unavailable, using autograd.Function: C++ compiler 'nope'"
               in r.getMessage() for r in caplog.records)
    info = _forward_info(fast)
    assert info.autograd == "autograd.Function" and info.allocator == "torch.empty_strided"
    out.sum().backward()
    eager(x).sum().backward()
    for g, want in zip(_grads(model), _grads(eager)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


def test_retain_graph_and_a_second_backward_as_eager(autograd_path):
    model, x = _mlp()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    out, ref = fast(x), eager(x)
    out.sum().backward(retain_graph=True)
    out.sum().backward()
    ref.sum().backward(retain_graph=True)
    ref.sum().backward()
    for g, want in zip(_grads(model), _grads(eager)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)
    if autograd_path == "native":     # eager's error; the Function autograd_path keeps its saved values
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            out.sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            ref.sum().backward()


def _weighted(x, w):
    return (x * w).sin()


def _shifted(x, w):
    return (x + w).sin()


def test_an_input_the_backward_reads_modified_in_place_raises_as_eager():
    # the native node's version check (the autograd.Function autograd_path keeps inputs unchecked)
    if nativeautograd.module() is None:
        pytest.skip("the native autograd extension cannot be built here")
    fast = tempa.compile(_weighted)
    x, w = torch.randn(5), torch.randn(5, requires_grad=True)
    fast(x, w)
    out = fast(x, w)
    assert _forward_info(fast).autograd == "native"
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    xe = torch.randn(5)
    ref = _weighted(xe, w)
    xe.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ref.sum().backward()


def test_an_input_the_backward_does_not_read_may_change_as_in_eager(autograd_path):
    fast = tempa.compile(_shifted)
    x, w = torch.randn(5), torch.randn(5, requires_grad=True)
    out = fast(x, w)
    x.add_(1)      # sin's backward reads x + w, a saved value, not x
    out.sum().backward()
    want = torch.cos((x - 1) + w).detach()
    torch.testing.assert_close(w.grad, want)


def test_hooks_on_outputs_and_on_the_node_run(autograd_path):
    model, x = _mlp()
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    seen = []
    out, ref = fast(x), eager(x)
    out.register_hook(lambda g: g * 3)
    ref.register_hook(lambda g: g * 3)
    out.grad_fn.register_prehook(lambda grads: seen.append("pre"))
    out.grad_fn.register_hook(lambda gi, go: seen.append(len(gi)))
    out.retain_grad()
    ref.retain_grad()
    out.sum().backward()
    ref.sum().backward()
    assert seen == ["pre", 5]
    torch.testing.assert_close(out.grad, ref.grad)
    for g, want in zip(_grads(model), _grads(eager)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


def _two_outputs(x, w):
    y = x * w
    return y.sin(), y > 0, y.cos()


def test_unused_and_non_differentiable_outputs(autograd_path):
    fast = tempa.compile(_two_outputs)
    x, w = torch.randn(6), torch.randn(6, requires_grad=True)
    s, i, c = fast(x, w)
    es, ei, ec = _two_outputs(x, w)
    assert _forward_info(fast).autograd == autograd_path
    assert not i.requires_grad and i.grad_fn is None and i.dtype == torch.bool
    assert s.requires_grad and c.requires_grad and s.grad_fn is c.grad_fn
    assert torch.equal(i, ei)
    g, = torch.autograd.grad(s.sum(), w)      # c's gradient is materialized as zeros
    want, = torch.autograd.grad(es.sum(), w)
    torch.testing.assert_close(g, want)


def _sigmoid_sum(x, w):
    y = (x * w).sigmoid()      # sigmoid's backward reads its own output
    return y


def test_a_saved_output_makes_no_reference_cycle(autograd_path):
    fast = tempa.compile(_sigmoid_sum)
    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    fast(x, w)
    out = fast(x, w)
    out.sum().backward(retain_graph=True)
    torch.testing.assert_close(w.grad, (x * out * (1 - out)).detach())
    node = weakref.ref(out.grad_fn) if autograd_path != "native" else None
    alive = weakref.ref(out)
    del out
    assert alive() is None                   # freed without the garbage collector
    assert node is None or node() is None


def test_a_saved_output_modified_in_place_raises_as_eager(autograd_path):
    fast = tempa.compile(_sigmoid_sum)
    x, w = torch.randn(4), torch.randn(4, requires_grad=True)
    out = fast(x, w)
    with torch.no_grad():
        out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_double_backward_is_eagers(autograd_path):
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    eager = copy.deepcopy(model)
    fast = tempa.compile(model)
    x = torch.randn(5, 4, requires_grad=True)

    def penalty(f):
        g, = torch.autograd.grad(f(x).sum(), x, create_graph=True)
        assert g.requires_grad
        return (g.norm(2, dim=1) - 1).pow(2).mean()

    pt, pe = penalty(fast), penalty(eager)
    assert _forward_info(fast).autograd == autograd_path
    torch.testing.assert_close(pt, pe)
    pt.backward()
    pe.backward()
    for g, want in zip(_grads(model), _grads(eager)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


def _sqrt(x, w):
    return (x * w).sqrt()


def test_anomaly_mode_names_the_node_of_a_nan_gradient(autograd_path):
    fast = tempa.compile(_sqrt)
    x, w = torch.zeros(3), torch.zeros(3, requires_grad=True)
    fast(x, w)
    with torch.autograd.detect_anomaly():
        out = fast(x, w)
        with pytest.raises(RuntimeError, match="TempaCompiledFunctionBackward' returned nan"):
            out.sum().backward()
        w1 = torch.ones(3, requires_grad=True)
        fast(torch.ones(3), w1).sum().backward()
    torch.testing.assert_close(w1.grad, torch.full((3,), 0.5))


def test_no_grad_inputs_mixed_with_grad_ones_and_no_grad_calls(autograd_path):
    fast = tempa.compile(_weighted)
    x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    fast(x, w)
    x2 = x.detach()
    out = fast(x2, w)
    out.sum().backward()
    torch.testing.assert_close(w.grad, (x2 * torch.cos(x2 * w)).detach())
    assert x2.grad is None and x.grad is None
    with torch.no_grad():
        assert fast(x, w).grad_fn is None


def test_forward_ad_through_the_training_graph(autograd_path):
    import torch.autograd.forward_ad as fwAD
    fast = tempa.compile(_weighted)
    x, w = torch.randn(5), torch.randn(5, requires_grad=True)
    fast(x, w)
    with fwAD.dual_level():
        tangent = fwAD.unpack_dual(fast(fwAD.make_dual(x, torch.ones(5)), w)).tangent
    torch.testing.assert_close(tangent, (w * torch.cos(x * w)).detach())


def test_graph_of_a_non_leaf_input_flows_through(autograd_path):
    fast = tempa.compile(_weighted)
    a, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    fast(a * 2, w)
    out = fast(a * 2, w)
    out.sum().backward()
    torch.testing.assert_close(a.grad, (2 * w * torch.cos(2 * a * w)).detach())
