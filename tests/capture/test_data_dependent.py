"""Values that depend on tensor contents (capture/scalars.py): ``.item()``, ``float(t)``,
``int(t)``, ``bool(t)``. Flowing into Python arithmetic and tensor operators they stay in
the graph (torch.compile with capture_scalar_outputs: 1 graph); driving a branch, an index
or a size they cost one clean graph break; a new value never recompiles (no guard on it).
torch.compile (CompileCounter) on the same code: flows/arith/float 1 frame with
capture_scalar_outputs (2 without, one break); branch 3 frames; int slice 1 frame."""
import pytest
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.recompiles, s.eager_fallbacks


def _run(fn, values, **kw):
    fast = tempa.compile(fn, **kw)
    x = torch.arange(6.0)
    for v in values:
        _same(fast(x, v), fn(x, v))


def _same(got, want):
    assert type(got) is type(want)
    if isinstance(want, tuple):
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    else:
        assert got == want


FLOATS = [torch.tensor(2.0), torch.tensor(-3.5), torch.tensor(4.25)]


def test_item_into_tensor_ops_is_one_graph_without_recompiles():
    def f(x, t):
        v = t.item()
        return x * (v * 2 + 1) - v / 4

    _run(f, FLOATS, fullgraph=True)
    assert _counts() == (1, 0, 0, 0)


@pytest.mark.parametrize("cast", [float, int])
def test_number_casts_into_tensor_ops(cast):
    def f(x, t):
        return x + cast(t) * 3

    _run(f, FLOATS, fullgraph=True)
    assert _counts() == (1, 0, 0, 0)


def test_python_scalar_type_promotion_is_kept():
    # int tensor * Python float is float32 (a 0-d float64 tensor would give float64)
    def f(x, t):
        return x.long() * t.item()

    _run(f, FLOATS, fullgraph=True)
    assert _counts() == (1, 0, 0, 0)


def test_a_returned_item_is_the_python_number():
    def f(x, t):
        return (t * 2).item() + 1

    _run(f, FLOATS + [torch.tensor(7.0)], fullgraph=True)
    assert _counts() == (1, 0, 0, 0)


def test_int_item_keeps_int_semantics():
    def f(x, t):
        n = t.item()
        return x * (n // 2) + n % 3

    _run(f, [torch.tensor(5), torch.tensor(-7), torch.tensor(9)], fullgraph=True)
    assert _counts() == (1, 0, 0, 0)


@pytest.mark.parametrize("case", ["branch", "bool", "slice", "index", "pow"])
def test_value_python_must_see_is_one_break_and_no_recompile(case):
    def branch(x, t):
        if t.item() > 0:
            return x + 1
        return x - 1

    def as_bool(x, t):
        return x + 1 if bool(t > 0) else x - 1

    def as_slice(x, t):
        return x[: int(t.abs())] * 2

    def as_index(x, t):
        return [x, x * 2, x * 3, x * 4, x * 5][int(t.abs())]

    def as_pow(x, t):
        return x * t.item() ** 0.5 if t.item() > 0 else x

    fn = {"branch": branch, "bool": as_bool, "slice": as_slice, "index": as_index,
          "pow": as_pow}[case]
    _run(fn, FLOATS)
    captures, breaks, recompiles, fallbacks = _counts()
    assert breaks >= 1 and recompiles == 0 and fallbacks == 0
    with pytest.raises(tempa.GraphBreakError):
        tempa.reset()
        tempa.compile(fn, fullgraph=True)(torch.arange(6.0), FLOATS[0])


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_item_of_a_tensor_with_several_elements_raises_eagers_error():
    fast = tempa.compile(lambda x: x * x.item())
    with pytest.raises(RuntimeError):
        fast(torch.ones(3))


def test_a_captured_number_answers_type_questions_as_the_number():
    def f(x, t):
        v = t.item()
        n = (t > 0).item()
        return x * abs(v), isinstance(v, float), type(v) is float, isinstance(n, bool), \
            isinstance(v, int)

    _run(f, FLOATS, fullgraph=True)
    assert _counts() == (1, 0, 0, 0)


def test_torch_check_on_a_captured_value_is_checked_on_every_call():
    def f(x, t):
        v = t.item()
        torch._check(v >= 0)
        return x * v

    fast = tempa.compile(f, fullgraph=True)
    x = torch.arange(3.0)
    torch.testing.assert_close(fast(x, torch.tensor(2.0)), f(x, torch.tensor(2.0)))
    with pytest.raises(RuntimeError):
        fast(x, torch.tensor(-1.0))
    assert _counts() == (1, 0, 0, 0)


def test_a_slice_bound_from_a_tensor_in_a_store_resumes_compiled():
    # 3.12+ stores through STORE_SLICE, decoded as BUILD_SLICE + STORE_SUBSCR: a break
    # there must hand the resume function the slice's start and stop, as CPython's stack
    # holds them (it ran the whole frame eagerly)
    def f(x, t):
        y = x.clone()
        y[: int(t.abs())] = 0.0
        return y * 2

    _run(f, FLOATS)
    captures, breaks, recompiles, fallbacks = _counts()
    assert recompiles == 0 and fallbacks == 0
    assert _counts() == (1, 1, 0, 0)


def test_a_graph_holding_a_captured_scalar_says_it_runs_aten_calls(caplog):
    # the backend cannot yet compute with a value .item() produced inside the graph: it
    # runs that graph with eager ATen calls, and says so on the fallbacks channel
    def f(x, t):
        return x * t.item()

    from tempa.backend import entry
    entry._warned.clear()
    with caplog.at_level("WARNING", logger="tempa.fallbacks"):
        _run(f, FLOATS)
    assert any("data-dependent" in r.getMessage() and "eager ATen calls" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
