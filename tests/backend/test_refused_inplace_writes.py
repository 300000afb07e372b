"""In-place writes eager refuses: to a tensor whose elements share memory (an expanded
view or input), and, with grad mode on and the base requiring grad, to an output of a
function that returns several views (unbind, split, chunk, split_with_sizes) or to a view
made under no_grad. The functionalized trace never met eager's error, so the compiled call
returned a value; such a graph now runs with ATen calls and raises eager's error. Without
grad (or through unsafe_split, which allows it) the autograd cases still compile to
kernels. The repros the differential harness also runs are imported from its case
library (tests/differential/cases_sound.py), so each is written once."""
import pytest
import torch

import tempa
from tests.differential.cases_sound import (bool_times_int_inplace, expand_then_inplace,
                                            expanded_copy_inplace, unbind_row_inplace)


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _split(t):
    x = t * 2
    a, b = x.split(1)
    a.mul_(3)
    return x.sum()


def _chunk(t):
    # cases_sound's chunk_row_inplace writes with mul_; this one through indexing (a copy_)
    x = t * 2
    a, b = torch.chunk(x, 2)
    a[0] = 5.0
    return b


def _split_with_sizes(t):
    x = t * 2
    a, b = x.split_with_sizes([1, 1])
    b += a
    return b


def _no_grad_view(t):
    with torch.no_grad():
        v = t[0]
    w = t * 2
    v.add_(w[1])
    return w


CASES = [unbind_row_inplace, _split, _chunk, _split_with_sizes, _no_grad_view]


def _expand_new_dim(t):
    y = t.expand(2, 2, 3)
    y.mul_(2)
    return t


def _relu_of_broadcast(t):
    torch.relu_(torch.broadcast_to(t, (5, 2, 3)))
    return t * 2


@pytest.mark.parametrize("fn", [expand_then_inplace, _expand_new_dim, _relu_of_broadcast],
                         ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad_input", "grad_input"])
def test_write_to_overlapping_memory_raises_eagers_error(fn, requires_grad):
    def make():
        t = torch.randn(1, 3) if fn is expand_then_inplace else torch.randn(2, 3)
        return t.requires_grad_(requires_grad) * 1
    want = _error(fn, make())
    assert want is not None and "single memory location" in want
    compiled = tempa.compile(fn)
    for _ in range(2):
        assert _error(compiled, make()) == want
    assert tempa.stats().eager_fallbacks == 0


def test_write_to_an_expanded_copy_compiles():
    t = torch.randn(1, 3)
    compiled = tempa.compile(expanded_copy_inplace)
    torch.testing.assert_close(compiled(t), expanded_copy_inplace(t))
    assert tempa.entries(compiled)[0].compiled.tempa_info.fallback_reason is None


def _error(fn, t):
    try:
        fn(t)
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.strip("_"))
def test_compiled_raises_eagers_error(fn):
    want = _error(fn, torch.randn(2, 3, requires_grad=True))
    assert want is not None and "inplace" in want
    compiled = tempa.compile(fn)
    for _ in range(2):       # every call, not only the first
        assert _error(compiled, torch.randn(2, 3, requires_grad=True)) == want
    assert tempa.stats().eager_fallbacks == 0
    for entry in tempa.entries(compiled):   # none where capture itself met the error
        assert "eager refuses" in entry.compiled.tempa_info.fallback_reason


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__.strip("_"))
def test_without_grad_the_graph_runs_as_kernels(fn):
    t = torch.randn(2, 3)
    want = fn(t.clone())
    compiled = tempa.compile(fn)
    torch.testing.assert_close(compiled(t.clone()), want)
    assert tempa.entries(compiled)[0].compiled.tempa_info.fallback_reason is None
    assert tempa.stats().kernels_compiled > 0


def test_unsafe_split_allows_the_write_and_compiles():
    def fn(t):
        x = t * 2
        a, b = x.unsafe_split(1)
        a.add_(1)
        return a + b
    t = torch.randn(2, 3, requires_grad=True)
    compiled = tempa.compile(fn)
    got, want = compiled(t), fn(t)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    assert tempa.entries(compiled)[0].compiled.tempa_info.fallback_reason is None


@pytest.mark.parametrize("fn, make", [
    (bool_times_int_inplace, lambda: torch.tensor([True, False])),
    (lambda x: x.int().add_(torch.tensor(1.5)), lambda: torch.tensor([1.0, 2.0])),
    (lambda x: x.long().__itruediv__(2), lambda: torch.tensor([1.0, 2.0])),
], ids=["bool_times_int", "int_plus_float_tensor", "int_true_division"])
def test_in_place_result_its_tensor_cannot_hold_raises_eagers_error(fn, make):
    want = _error(fn, make())
    assert want is not None and "can't be cast" in want
    compiled = tempa.compile(fn)
    for _ in range(2):
        assert _error(compiled, make()) == want


def test_in_place_result_its_tensor_can_hold_compiles():
    fn = lambda x: x.long().div_(2, rounding_mode="floor").add_(True)  # noqa: E731
    x = torch.tensor([3.0, 8.0])
    compiled = tempa.compile(fn)
    torch.testing.assert_close(compiled(x), fn(x))
    assert tempa.entries(compiled)[0].compiled.tempa_info.fallback_reason is None


@pytest.mark.parametrize("fn", [lambda x: x // 2, lambda x: torch.floor_divide(x * 2, 3) + x],
                         ids=["operator", "function"])
def test_op_without_derivative_raises_eagers_error_in_backward(fn):
    """floor_divide has no derivative: eager's backward raises where an input requires
    grad; the joint trace differentiated its decomposition and returned a gradient."""
    def backward_error(f):
        try:
            f(torch.randn(3, requires_grad=True)).sum().backward()
        except RuntimeError as e:
            return str(e).splitlines()[0]
        return None
    want = backward_error(fn)
    assert want is not None and "derivative for" in want
    compiled = tempa.compile(fn)
    for _ in range(2):
        assert backward_error(compiled) == want
    torch.testing.assert_close(compiled(torch.arange(3.0)), fn(torch.arange(3.0)))
    assert tempa.stats().kernels_compiled > 0     # without grad it still compiles
