"""torch.func.vjp and torch.func.jvp of Python functions in captured code (one graph, as
under torch.compile), and torch.autograd.functional's transforms (one named break each, as
under torch.compile: the call runs eagerly, whole)."""
import pytest
import torch
import torch.utils._pytree as pytree

import tempa

_V = torch.randn(4, dtype=torch.float64)


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


def _vjp_of_one_output(x):
    out, vjp_fn = torch.func.vjp(lambda t: t.sin() * _V, x)
    return out + 1, vjp_fn(x.cos())[0] * 2


def _vjp_of_two_inputs_with_aux(x, y):
    out, vjp_fn, aux = torch.func.vjp(lambda a, b: ((a * b).sin(), a.cos() * _V), x, y,
                                      has_aux=True)
    ga, gb = vjp_fn(x.cos())
    return out, aux, ga, gb


def _vjp_of_two_outputs(x, y):
    _, vjp_fn = torch.func.vjp(lambda t: (t.sin(), t * _V), x)
    return vjp_fn((y, torch.ones_like(x)))


def _jvp_of_two_inputs(x, y):
    return torch.func.jvp(lambda a, b: (a * b).sin() * _V, (x, y), (torch.ones_like(x), y))


def _jvp_of_two_outputs_with_aux(x, y):
    return torch.func.jvp(lambda a: ((a.sin(), a.exp() * y), a.cos()), (x,), (y,), has_aux=True)


_CASES = [_vjp_of_one_output, _vjp_of_two_inputs_with_aux, _vjp_of_two_outputs,
          _jvp_of_two_inputs, _jvp_of_two_outputs_with_aux]


def _inputs(fn, requires_grad):
    torch.manual_seed(0)
    n = fn.__code__.co_argcount
    return [torch.randn(4, dtype=torch.float64, requires_grad=requires_grad) for _ in range(n)]


@pytest.mark.parametrize("backend", ["eager", "tempa"])
@pytest.mark.parametrize("fn", _CASES, ids=lambda f: f.__name__)
def test_func_vjp_and_jvp_are_one_graph_with_eager_values(fn, backend):
    inputs = _inputs(fn, requires_grad=False)
    fast = tempa.compile(fn, backend=backend, fullgraph=True)
    for _ in range(2):
        torch.testing.assert_close(fast(*inputs), fn(*inputs))
    assert _counts() == (1, 0, 0)


@pytest.mark.parametrize("backend", ["eager", "tempa"])
@pytest.mark.parametrize("fn", _CASES, ids=lambda f: f.__name__)
def test_func_vjp_and_jvp_get_eager_gradients(fn, backend):
    """The transforms' results keep their history for outer autograd, as in eager."""
    _compiled_matches_eager_with_gradients(fn, backend)


def _history(tensors):
    return [(t.requires_grad, t.grad_fn is None) for t in tensors]


def _compiled_matches_eager_with_gradients(fn, backend):
    """Values, autograd history and gradients through every output as eager's, in one graph."""
    inputs = _inputs(fn, requires_grad=True)
    got = tempa.compile(fn, backend=backend, fullgraph=True)(*inputs)
    want = fn(*inputs)
    torch.testing.assert_close(got, want)
    got, want = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert _history(got) == _history(want)
    weights = [torch.randn_like(t) for t in want]
    got_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(got, weights)), inputs)
    want_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(want, weights)), inputs)
    torch.testing.assert_close(got_grads, want_grads)
    assert _counts() == (1, 0, 0)


# Derivatives that no input's value reaches once decomposed to ATen ops (constants), which
# eager's outputs still record: requires_grad, a grad_fn.
def _jvp_of_a_linear_function(x):
    return torch.func.jvp(lambda a: a * 2, (x,), (torch.ones_like(x),))


def _jacfwd_of_a_linear_function(x, y):
    return torch.func.jacfwd(lambda a: a * 2)(x), y.sin()


def _hessian_of_a_quadratic(x):
    return torch.func.hessian(lambda a: (a * a).sum())(x)


@pytest.mark.parametrize("native_autograd", [True, False])
@pytest.mark.parametrize("backend", ["eager", "tempa"])
@pytest.mark.parametrize("fn", _CASES + [_jvp_of_a_linear_function, _jacfwd_of_a_linear_function,
                                         _hessian_of_a_quadratic], ids=lambda f: f.__name__)
def test_func_transform_outputs_have_eager_history(fn, backend, native_autograd, monkeypatch):
    """Every output requires grad and has a grad_fn exactly where eager's does, also where
    the ATen trace computes it from constants alone; and the gradients through them are
    eager's (zeros there, not none)."""
    monkeypatch.setattr(tempa.config, "native_autograd", native_autograd)
    _compiled_matches_eager_with_gradients(fn, backend)


def test_vjp_function_called_after_an_in_place_write_breaks_by_name():
    """Eager's vjp_fn reads the values of the vjp call; recomputing it from the primals
    written since would not, so that graph is not made."""
    def f(x):
        _, vjp_fn = torch.func.vjp(lambda t: t.sin() * _V, x)
        x.mul_(2)
        return vjp_fn(torch.ones_like(x))

    x = torch.randn(4, dtype=torch.float64)
    with pytest.raises(tempa.GraphBreakError, match="called after a tensor was written in place"):
        tempa.compile(f, fullgraph=True)(x.clone())
    tempa.reset()
    got, want = x.clone(), x.clone()
    torch.testing.assert_close(tempa.compile(f)(got), f(want))
    torch.testing.assert_close(got, want)


def test_vjp_function_writing_its_argument_breaks_by_name():
    def f(x):
        return torch.func.vjp(lambda t: t.mul_(2), x.clone())[0]

    with pytest.raises(tempa.GraphBreakError, match="torch.func.vjp writes a tensor it was given"):
        tempa.compile(f, fullgraph=True)(torch.randn(3))


def _sum_sin(t):
    return (t.sin() * _V).sum()


def _sin(t):
    return t.sin() * _V


_AF = torch.autograd.functional
# transform, its function, whether it takes a vector, the result's part compared
_AUTOGRAD_FUNCTIONAL = {"jacobian": (_AF.jacobian, _sin, False, None),
                        "hessian": (_AF.hessian, _sum_sin, False, None),
                        "vjp": (_AF.vjp, _sum_sin, False, 1),
                        "jvp": (_AF.jvp, _sin, True, 1),
                        "hvp": (_AF.hvp, _sum_sin, True, 1),
                        "vhp": (_AF.vhp, _sum_sin, True, 1)}
_CAPTURED = {"jacobian": "jacrev or jacfwd", "hessian": "hessian", "vjp": "vjp", "jvp": "jvp",
             "hvp": "jvp of torch.func.grad", "vhp": "vjp of torch.func.grad"}


@pytest.mark.parametrize("name", list(_AUTOGRAD_FUNCTIONAL))
def test_autograd_functional_runs_eagerly_by_name(name):
    """Each runs the autograd engine on its function's outputs: one break, and the call runs
    eagerly whole (compiling the function inside it gave wrong hessians and raised for hvp)."""
    transform, func, takes_vector, part = _AUTOGRAD_FUNCTIONAL[name]

    def f(x):
        y = x * 1
        result = transform(func, y, torch.ones_like(y)) if takes_vector else transform(func, y)
        return (result if part is None else result[part]) + 1

    x = torch.randn(4, dtype=torch.float64, requires_grad=True)
    fast = tempa.compile(f)
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x))
    assert _counts() == (2, 1, 0)   # before and after the call (torch.compile: one break too)
    reasons = [r.reason for r in tempa.explain(f)(x).break_reasons]
    assert reasons == [f"torch.autograd.functional.{name} runs the autograd engine: it runs "
                       f"eagerly (torch.func.{_CAPTURED[name]} is captured)"]
