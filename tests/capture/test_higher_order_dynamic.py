"""Higher-order constructs once sizes are symbolic (automatic dynamic shapes): torch.cond,
user autograd Functions, checkpoint and torch.func's transforms stay one graph that serves
every size (their operations' fake kernels run the subgraphs on the symbolic inputs)."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

import tempa

_W = torch.randn(3, dtype=torch.float64)


class _NotTheDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x      # the user's gradient, not autograd's


class _SumRows(torch.autograd.Function):
    """Keeps a size on ctx for its backward (a symbol of the capture)."""

    @staticmethod
    def forward(ctx, x):
        ctx.rows = x.shape[0]
        return x.sum(0) * 1

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.rows, -1) * 2


def _function(x, flag):
    return _NotTheDerivative.apply(x.sin()).cos().sum()


def _function_keeping_a_size(x, flag):
    return (_SumRows.apply(x) * _W).sum()


def _cond(x, flag):
    (y,) = torch.cond(flag, lambda t: (t.sin() * _W,), lambda t: (t.cos() + _W,), (x,))
    return y.sum()


def _checkpointed(x, flag):
    return checkpoint(lambda t: torch.tanh(t * _W).exp(), x, use_reentrant=False).sum()


def _vjp(x, flag):
    return torch.func.vjp(lambda t: t.sin() * _W, x)[1](x)[0].sum()


def _grad_and_vmap(x, flag):
    per_row = torch.vmap(lambda r: (r * _W).cos() * r.sum())(x)
    return per_row.sum() + torch.func.grad(lambda t: (t.sin() * _W).sum())(x).sum()


def _eager_reference(fn):
    if fn is not _cond:
        return fn

    def cond_in_eager(x, flag):
        # eager's torch.cond runs torch.compile, which imports Dynamo for the whole session
        return ((x.sin() * _W) if bool(flag) else (x.cos() + _W)).sum()
    return cond_in_eager


def _value_and_grad(fn, x, flag):
    x = x.detach().clone().requires_grad_()
    out = fn(x, flag)
    out.backward()
    return out, x.grad


@pytest.mark.parametrize("backend", ["eager", "tempa"])
@pytest.mark.parametrize("fn", [_function, _function_keeping_a_size, _cond, _checkpointed,
                                _vjp, _grad_and_vmap], ids=lambda f: f.__name__.strip("_"))
def test_higher_order_constructs_serve_every_size_from_one_graph(fn, backend):
    fast = tempa.compile(fn, backend=backend, fullgraph=True)
    for rows in (4, 5, 6, 9):
        x, flag = torch.randn(rows, 3, dtype=torch.float64), torch.tensor(rows % 2 == 0)
        got, got_grad = _value_and_grad(fast, x, flag)
        want, want_grad = _value_and_grad(_eager_reference(fn), x, flag)
        torch.testing.assert_close((got, got_grad), (want, want_grad))
    # the first size's graph, then one with a symbolic row count for the others
    assert (tempa.stats().captures, tempa.stats().graph_breaks) == (2, 0)
    assert "x.shape[0] >= 2" in tempa.entries(fast)[0].guards


def test_cond_reading_a_size_from_outside_its_branches_breaks_by_name():
    def f(x):
        n = x.shape[0]
        return torch.cond(x.sum() > 0, lambda t: t * n, lambda t: t - n, (x,))

    fast = tempa.compile(f)
    for rows in (4, 5):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(fast(x), x * rows if x.sum() > 0 else x - rows)
    tempa.reset()
    tempa.mark_dynamic(x, 0)
    with pytest.raises(tempa.GraphBreakError, match="torch.cond branch reads a size or number"):
        tempa.compile(f, fullgraph=True)(x)
