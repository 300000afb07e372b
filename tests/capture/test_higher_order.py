"""Higher-order constructs in captured code (issue 16 item 4): torch.compiler.disable,
user autograd Functions, torch.utils.checkpoint."""
import pytest
import torch

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


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
    assert tempa.compile(_disabled_item)(x) == _disabled_item(x)
    assert _counts() == (0, 0, 0)
