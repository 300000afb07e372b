"""A resumed frame finds its graph again on every call (issue 16): what the eager part of
a frame hands to the resume function (the iterator of a loop or of ``iter(...)``, the
``.0`` iterator of a CPython 3.11 comprehension) is made anew by every call, so it is
guarded by class and the items it has left, never by identity (which recaptured the
resumed frame on every call). torch.compile on the same code: 1 graph, nothing new on
later calls."""
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


def _break():
    print("", end="")   # a graph break: print has effects outside the graph


def _calls(fn, n=3):
    fast = tempa.compile(fn, backend="eager")
    x = torch.ones(3)
    seen = []
    for _ in range(n):
        want, got = fn(x), fast(x)
        assert repr(got) == repr(want)
        seen.append(_counts())
    return seen


def test_an_iterator_alive_at_a_break_is_handed_to_the_resume_function_by_its_items():
    def f(x):
        it = iter([x, x + 1])
        _break()
        return next(it) * 2 + next(it)
    first, *later = _calls(f)
    assert all(c == first for c in later)
    assert first[2] == 0


def test_a_comprehension_run_after_a_break_reuses_its_graph():
    def f(x):
        ys = [x + i for i in range(3)]
        return [y * 2 for y in ys if _break() is None]
    first, *later = _calls(f)
    assert all(c == first for c in later)
    assert first[2] == 0


def test_an_iterator_handed_in_is_moved_on_as_far_as_the_capture_took_it():
    def f(x, it):
        return x + next(it)
    fast = tempa.compile(f, backend="eager")
    x = torch.zeros(2)
    eager_it, compiled_it = iter([1, 2, 3, 4]), iter([1, 2, 3, 4])
    for _ in range(2):
        assert torch.equal(fast(x, compiled_it), f(x, eager_it))
    assert list(compiled_it) == list(eager_it) == [3, 4]
    assert _counts() == (2, 0, 0)   # the items left differ (4, then 3): by value, as guarded
