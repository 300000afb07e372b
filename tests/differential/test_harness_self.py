"""The harness can fail: feed the comparer a deliberately wrong "compiled" run (another
eager function that differs in one observable way) and check that it reports exactly that
kind of difference; and an identical run reports nothing."""
import warnings

import pytest
import torch

from .harness import Case, R, State, call, compare_records, mutate, probe, run_case


def _diffs(expected_fn, actual_fn, steps, **options):
    """Differences reported when `actual_fn` plays the compiled run of `expected_fn`."""
    def case(fn, extra):
        return Case("self", lambda: State(fn=fn, **extra()), steps, **options)
    extra = options.pop("state", dict)
    expected = run_case(case(expected_fn, extra), None)
    actual = run_case(case(actual_fn, extra), None)
    return compare_records(actual, expected, case(expected_fn, extra), "fake")


def _one_diff_about(diffs, *words):
    assert diffs, "the comparer reported nothing"
    assert any(all(w in d for w in words) for d in diffs), diffs


X = torch.tensor([1.0, -2.0, 3.0])


def test_identical_runs_report_nothing():
    def f(x, acc):
        acc.append(x.sum())
        warnings.warn("w")
        return x.add_(1), x.view(3, 1), torch.tensor([1, 2]) // 2, float("nan")
    assert _diffs(f, f, [call(X, R("acc")), call(X, R("acc"))], state=lambda: {"acc": []}) == []


def test_wrong_value():
    _one_diff_about(_diffs(lambda x: x * 2, lambda x: x * 2 + 1e-3, [call(X)]), "result", "not close")


def test_int_values_are_exact():
    _one_diff_about(_diffs(lambda x: x.long() // 2, lambda x: x.long() // 2 + (x > 2).long(), [call(X)]),
                    "result")


def test_nan_equals_nan_but_not_a_number():
    nan = torch.tensor([float("nan")])
    assert _diffs(lambda x: x * nan, lambda x: x * nan, [call(X)]) == []
    _one_diff_about(_diffs(lambda x: x * nan, lambda x: x * 0, [call(X)]), "result")


def test_signed_zero_python_float():
    _one_diff_about(_diffs(lambda x: -0.0, lambda x: 0.0, [call(X)]), "result")


def test_lost_identity_of_returned_input():
    def eager(x):
        x.add_(1)
        return x

    def copy(x):
        x.add_(1)
        return x.clone()
    _one_diff_about(_diffs(eager, copy, [call(X)]), "aliasing")


def test_lost_view_between_outputs():
    def eager(x):
        a = x + 1
        return a, a.view(3, 1)

    def copies(x):
        a = x + 1
        return a, a.clone().view(3, 1)
    _one_diff_about(_diffs(eager, copies, [call(X)]), "aliasing")


def test_output_view_of_state_buffer_lost():
    state = lambda: {"buf": torch.zeros(4)}   # noqa: E731
    _one_diff_about(_diffs(lambda x, b: b[1:3], lambda x, b: b[1:3].clone(), [call(X, R("buf"))],
                           state=state), "aliasing")


def test_missing_warning():
    def warns(x):
        warnings.warn("careful")
        return x
    _one_diff_about(_diffs(warns, lambda x: x, [call(X)]), "warnings")


def test_wrong_exception_type():
    def index_error(x):
        raise IndexError("out of range")

    def runtime_error(x):
        raise RuntimeError("out of range")
    _one_diff_about(_diffs(index_error, runtime_error, [call(X)]), "exception", "IndexError", "RuntimeError")


def test_exception_lost():
    def raises(x):
        raise ValueError("no")
    _one_diff_about(_diffs(raises, lambda x: x, [call(X)]), "exception", "no exception")


def test_message_only_when_asked():
    def a(x):
        raise TypeError("f() missing 1 required argument")

    def b(x):
        raise TypeError("___entry() missing 1 required argument")
    assert _diffs(a, b, [call(X)]) == []
    _one_diff_about(_diffs(a, b, [call(X)], check_message=True), "exception")


@pytest.mark.parametrize("expected,actual", [
    (lambda x: x.max(0), lambda x: tuple(x.max(0))),            # torch.return_types
    (lambda x: map(abs, [1, 2]), lambda x: [1, 2]),              # a lazy map object
    (lambda x: x.as_subclass(torch.nn.Parameter), lambda x: x),  # a tensor subclass
    (lambda x: 3, lambda x: 3.0),                                # Python types
])
def test_wrong_type(expected, actual):
    _one_diff_about(_diffs(expected, actual, [call(X)]), "result", "expected")


def test_requires_grad_and_grad_fn_lost():
    w = torch.ones(3, requires_grad=True)
    _one_diff_about(_diffs(lambda x: x * w, lambda x: (x * w).detach(), [call(X)]), "requires_grad")


def test_wrong_gradient():
    state = lambda: {"w": torch.ones(3, requires_grad=True)}   # noqa: E731
    _one_diff_about(_diffs(lambda x, w: (x * w).sum(), lambda x, w: (x * w * 1.5).sum(),
                           [call(X, R("w"), _backward=True)], state=state), "grad")


def test_lost_side_effect_on_state():
    state = lambda: {"acc": []}   # noqa: E731

    def appends(x, acc):
        acc.append(x.sum())
        return x
    _one_diff_about(_diffs(appends, lambda x, acc: x, [call(X, R("acc"))], state=state), "acc")


def test_lost_mutation_of_an_argument():
    def mutates(x):
        x.mul_(2)
        return None
    _one_diff_about(_diffs(mutates, lambda x: None, [call(X)]), "args")


def test_version_counter_only_when_asked():
    def bumps(x):
        x.add_(0)
        return None
    assert _diffs(bumps, lambda x: None, [call(X)]) == []
    _one_diff_about(_diffs(bumps, lambda x: None, [call(X)], check_version=True), "version")


def test_grad_mode_left_disabled():
    def leaves_disabled(x):
        torch.set_grad_enabled(False)
        return x
    try:
        _one_diff_about(_diffs(lambda x: x, leaves_disabled, [call(X)]), "grad_enabled")
    finally:
        torch.set_grad_enabled(True)


def test_probe_and_mutation_steps_are_compared():
    state = lambda: {"cfg": {"k": 1}}   # noqa: E731
    steps = [call(X, R("cfg")), mutate(lambda s: s.cfg.update(k=2)), call(X, R("cfg")),
             probe(lambda s: s.cfg["k"])]

    def stale(x, cfg, _seen=[]):   # remembers the first value: a stale answer
        _seen.append(cfg["k"])
        return x * _seen[0]
    _one_diff_about(_diffs(lambda x, cfg: x * cfg["k"], stale, steps, state=state), "step 2", "result")


def test_wrong_layout():
    m = torch.arange(6.0).reshape(2, 3)
    _one_diff_about(_diffs(lambda x: x.t() * 2, lambda x: (x.t() * 2).contiguous(), [call(m)]),
                    "result", "strides")
