"""Python's max()/min() over one-element tensors (capture/selections.py): one graph with
torch.where where the object eager picks cannot be told from the value, else a break at
the call and eager picks it. torch.compile (CompileCounter) captures every case here in
one frame with torch.maximum/clamp, which differs from eager on NaN, ties' gradients and
which object comes back."""
import pytest
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


def _sums(n):
    torch.manual_seed(0)
    return [torch.randn(4) for _ in range(n)]


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_max_over_mapped_sums_is_one_graph(backend):
    def f(a, b):
        return max(map(lambda t: t.sum(), [a, b])) * 2

    fast = tempa.compile(f, fullgraph=True, backend=backend)
    for a, b in [_sums(2), _sums(2)[::-1]]:
        torch.testing.assert_close(fast(a, b), f(a, b))
    assert _counts() == (1, 0, 0)


def test_first_of_equal_or_nan_items_is_kept():
    # bool(nan > best) is False: eager keeps what it has; torch.maximum would give NaN
    def f(a, b, c):
        return min(a.sum(), b.sum(), c.sum()) + max(c.sum(), a.sum(), b.sum())

    nan = torch.tensor([float("nan"), 0.0])
    fast = tempa.compile(f, fullgraph=True, backend="eager")
    for args in [(torch.ones(2), nan, -torch.ones(2)), (nan, torch.ones(2), torch.ones(2))]:
        torch.testing.assert_close(fast(*args), f(*args), equal_nan=True)
    assert _counts() == (1, 0, 0)


def test_result_leaving_with_an_item_breaks_and_keeps_identity():
    def f(a, b):
        x, y = a.sum(), b.sum()
        return max(x, y), x

    a, b = _sums(2)
    got, want = tempa.compile(f, backend="eager")(a, b), f(a, b)
    assert (got[0] is got[1]) == (want[0] is want[1])
    torch.testing.assert_close(got, want)
    assert _counts() == (2, 1, 0)


def test_write_into_the_result_breaks():
    def f(a, b):
        x, y = a.sum(), b.sum()
        m = min(x, y)
        m.add_(1)   # writes into x or y
        return x + y

    a, b = _sums(2)
    torch.testing.assert_close(tempa.compile(f, backend="eager")(a, b), f(a, b))
    assert _counts() == (2, 1, 0)


def test_is_on_the_result_breaks():
    def f(a, b):
        x, y = a.sum(), b.sum()
        return min(x, y) is x

    for a, b in [_sums(2), _sums(2)[::-1]]:
        tempa.reset()
        assert tempa.compile(f, backend="eager")(a, b) == f(a, b)
        assert _counts() == (2, 1, 0)


def test_input_returned_breaks():
    def f(a, b):
        return max(a, b)

    a, b = torch.tensor([1.0]), torch.tensor([2.0])
    assert tempa.compile(f, backend="eager")(a, b) is b
    assert _counts() == (2, 1, 0)


def test_items_requiring_grad_break_and_leave_the_other_gradient_none():
    def f(a, b):
        return max(a.sum(), b.sum()) * 3

    a, b = torch.tensor([1.0], requires_grad=True), torch.tensor([2.0], requires_grad=True)
    tempa.compile(f, backend="eager")(a, b).backward()
    assert a.grad is None and b.grad.item() == 3.0
    assert _counts() == (2, 1, 0)


@pytest.mark.passes_without_capture("the compiled call raises eager's own error")
def test_several_elements_raise_eagers_error():
    def f(a, b):
        return max(a, b)

    with pytest.raises(RuntimeError, match="more than one value"):
        tempa.compile(f, backend="eager")(*_sums(2))


def test_single_item_is_returned_itself():
    def f(a):
        return max([a])

    a = torch.randn(3)
    assert tempa.compile(f, fullgraph=True, backend="eager")(a) is a
    assert tempa.stats().captures == 1   # one graph (returning its input), not an eager run
