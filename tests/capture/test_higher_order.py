"""Higher-order constructs in captured code (issue 16 item 4): torch.compiler.disable,
user autograd Functions, torch.utils.checkpoint."""
import pytest
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


@torch.compiler.disable
def _disabled_item(x):
    # .item() would be a break of its own if tempa traced into the disabled function
    return x.sum().item() + 1


def test_compiler_disable_is_one_clean_break():
    def f(x):
        y = x * 2
        return y + _disabled_item(y)

    x = torch.randn(4)
    fast = tempa.compile(f)
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x))
    assert _counts() == (2, 1, 0)   # the part before and the resume after, as torch.compile
    report = tempa.explain(f)(x)
    assert [r.type for r in report.break_reasons] == ["disabled by torch.compiler.disable"]


def test_dynamo_disable_decorator_and_disabled_method():
    import torch._dynamo

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        @torch._dynamo.disable
        def helper(self, x):
            return x * float(x.detach().sum())

        def forward(self, x):
            return torch.relu(self.helper(self.lin(x))) + 1

    m, x = M(), torch.randn(2, 4)
    torch.testing.assert_close(tempa.compile(m)(x), m(x))
    assert _counts() == (2, 1, 0)


def test_compiler_disable_under_fullgraph_names_the_function():
    def f(x):
        return x + _disabled_item(x)

    with pytest.raises(tempa.GraphBreakError, match="_disabled_item is marked @torch.compiler.disable"):
        tempa.compile(f, fullgraph=True)(torch.randn(3))


def test_compiled_disabled_function_runs_eagerly():
    x = torch.randn(3)
    fast = tempa.compile(_disabled_item)
    assert fast(x) == _disabled_item(x)
    assert _counts() == (0, 0, 0)
    assert tempa.eager_reasons(fast) == ["_disabled_item: disabled by torch.compiler.disable"]


class _StraightThroughRound(torch.autograd.Function):
    """round() forward, identity-times-scale backward: not the derivative of the forward
    (0 almost everywhere), so autograd differentiating the forward gives other gradients."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.round(x * scale)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ctx.scale + x * 0, None


def _uses_ste(x):
    return _StraightThroughRound.apply(x.sin(), 3.0).cos().sum()


def _value_and_grad(fn, x):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    out.backward()
    return out, x.grad


def test_autograd_function_uses_the_users_backward():
    x, fast = torch.randn(5), tempa.compile(_uses_ste)
    for _ in range(2):
        out, grad = _value_and_grad(fast, x)
        want_out, want_grad = _value_and_grad(_uses_ste, x)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(grad, want_grad)
    # Fn.apply runs eagerly (one break), the code around it is captured
    assert _counts() == (2, 1, 0)


def test_autograd_function_under_fullgraph_is_refused_by_name():
    with pytest.raises(tempa.GraphBreakError, match="_StraightThroughRound.apply"):
        tempa.compile(_uses_ste, fullgraph=True)(torch.randn(5, requires_grad=True))


def test_checkpoint_is_captured_as_the_call():
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    def block(x, scale=1.0):
        return torch.relu(lin(x)) * scale

    def f(x):
        return checkpoint(block, x.sin(), use_reentrant=False, scale=2.0).cos().sum()

    x, fast = torch.randn(3, 4), tempa.compile(f, fullgraph=True)
    for _ in range(2):
        out, grad = _value_and_grad(fast, x)
        want_out, want_grad = _value_and_grad(f, x)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(grad, want_grad)
    assert _counts() == (1, 0, 0)


def test_reentrant_checkpoint_runs_eagerly_by_name():
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(torch.sin, x, use_reentrant=True) + 1

    with pytest.raises(tempa.GraphBreakError, match="use_reentrant=False"):
        tempa.compile(f, fullgraph=True)(torch.randn(3, requires_grad=True))
