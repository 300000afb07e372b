"""The autograd variant hands out eager's views: an output that eager returns as a view of
an input (``x[1:]``, ``x.t()``, ``x.view(-1)``, an empty slice) or of another output is a
view of it, recorded by autograd so its gradient reaches the base, and ``x.detach()``
shares the input's memory without requiring grad. The compiled autograd Function returned
copies: writing through them did not reach the input."""
import pytest
import torch

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("fn", [
    lambda x, w: (x[1:], x * w),
    lambda x, w: (x.t(), (x * w).sum()),
    lambda x, w: (x.view(-1), x[:, 2], x * w),
    lambda x, w: (x[3:1], x * w),
    lambda x, w: (lambda y: (y, y.t()))(x * w),
    lambda x, w: (lambda y: (y, y[1:]))(x * w),
], ids=["slice", "transpose", "view_select", "empty", "view_of_output", "slice_of_output"])
def test_views_of_inputs_and_outputs_are_views_with_eagers_gradients(fn):
    def inputs():
        torch.manual_seed(0)
        return torch.randn(3, 4).mul(2).requires_grad_(), torch.randn(4, requires_grad=True)
    (x, w), (cx, cw) = inputs(), inputs()
    compiled = tempa.compile(fn)
    want, got = fn(x, w), compiled(cx, cw)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
        assert (g.shape, g.stride(), g.requires_grad) == (e.shape, e.stride(), e.requires_grad)
        assert _shares(g, cx) == _shares(e, x)
        assert [_shares(g, o) for o in got] == [_shares(e, o) for o in want]
    sum(o.float().pow(2).sum() * (k + 1) for k, o in enumerate(want)).backward()
    sum(o.float().pow(2).sum() * (k + 1) for k, o in enumerate(got)).backward()
    torch.testing.assert_close(cx.grad, x.grad)
    torch.testing.assert_close(cw.grad, w.grad)
    assert tempa.entries(compiled)[0].compiled.tempa_info.fallback_reason is None


def test_detach_shares_the_input_and_does_not_require_grad():
    fn = lambda x: (x.detach(), x * 2)  # noqa: E731
    x = torch.randn(3, requires_grad=True)
    d, y = tempa.compile(fn)(x)
    assert _shares(d, x) and not d.requires_grad and d.is_leaf and y.requires_grad
    d[0] = 7.0
    assert x[0].item() == 7.0


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_views_stay_views_when_the_sizes_change(requires_grad):
    """After a call at a second size the graph is recompiled for symbolic sizes; a view's
    sizes, strides and offset recorded at one size do not hold at others, and the
    shape-generic code handed out copies. Such a graph is compiled per shape instead."""
    fn = lambda x: (x[1:], x.t(), x * 2)  # noqa: E731
    compiled = tempa.compile(fn)
    for rows in (3, 5, 6):
        x = torch.randn(rows, 4, requires_grad=requires_grad)
        got, want = compiled(x), fn(x)
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)
            assert (g.shape, g.stride()) == (e.shape, e.stride())
            assert _shares(g, x) == _shares(e, x)
    assert tempa.stats().eager_fallbacks == 0
