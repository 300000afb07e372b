"""Automatic dynamic for Python ints (issue 16: never a recompile for every new value).

An int read from outside (an argument, an attribute of the caller's object, a cell) is
guarded by value at first; once a recompile finds it changed, it is a symbol: a graph
input whose uses become guards on the symbol, so later values reuse the graph. Each test
compares values with eager and the counts with torch.compile's on the same code (torch
2.13 CPU, in the comments)."""
import pytest
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


THREE = 3


class Counter:
    def __init__(self, n):
        self.n = n


def _run(fn, calls):
    """Each call's arguments are made twice (eager and compiled get their own objects)."""
    fast = tempa.compile(fn, backend="eager")
    for make in calls:
        want, got = fn(*make()), fast(*make())
        assert type(got) is type(want)
        if isinstance(want, tuple):
            assert len(got) == len(want)
            for w, g in zip(want, got):
                assert torch.equal(w, g) if isinstance(w, torch.Tensor) else (type(w), w) == (type(g), g)
        else:
            assert torch.equal(got, want)
    return fast


def test_an_attribute_counter_of_the_callers_object_is_one_graph_after_it_changes():
    def f(x, c):
        return x + c.n
    x = torch.arange(4.)
    _run(f, [lambda n=n: (x, Counter(n)) for n in range(6)])
    assert _counts() == (2, 0, 0)   # torch.compile: 2


def test_an_int_argument_is_one_graph_after_it_changes():
    def f(x, n):
        return x * n, n + 1, n // 2
    x = torch.arange(4.)
    _run(f, [lambda n=n: (x, n) for n in range(1, 7)])
    assert _counts() == (2, 0, 0)   # torch.compile: 2


def test_a_branch_on_a_symbolic_int_is_a_guard_on_the_symbol():
    def f(x, n):
        if n > 2:
            return x + 1
        return x - 1
    x = torch.arange(4.)
    # 1 (static), 2 (symbolic, n <= 2), 3 (symbolic, n > 2), then reused
    _run(f, [lambda n=n: (x, n) for n in range(1, 8)])
    assert _counts() == (3, 0, 0)   # torch.compile: 3


def test_an_int_used_as_a_size_makes_the_shape_symbolic():
    def f(x, n):
        return torch.zeros(n) + x[:n].sum()
    x = torch.arange(8.)
    _run(f, [lambda n=n: (x, n) for n in range(2, 8)])
    assert _counts() == (2, 0, 0)   # torch.compile: 2


@pytest.mark.parametrize("use", ["index", "range", "dict key", "is"])
def test_an_int_whose_use_needs_its_value_is_still_right(use):
    def index(x, n):
        return x + [10, 20, 30, 40, 50, 60][n]

    def loop(x, n):
        for i in range(n):
            x = x + i
        return x

    def key(x, n):
        return x + {1: 5, 2: 7, 3: 9}.get(n, 0)

    def identity(x, n):
        return x + (1 if n is THREE else 0)   # which int object it is (small ints are cached)
    fn = {"index": index, "range": loop, "dict key": key, "is": identity}[use]
    x = torch.arange(4.)
    _run(fn, [lambda n=n: (x, n) for n in range(5)])
    # the value decides each call (torch.compile: 5 graphs for each, wrong for `is`)
    assert _counts() == (5, 0, 0)


def test_a_symbolic_int_is_still_an_int_to_the_code():
    def f(x, n):
        if isinstance(n, int) and type(n) is int:
            return x + n + (n == 2) + (n != 3)
        return x
    x = torch.arange(4.)
    _run(f, [lambda n=n: (x, n) for n in range(5)])
    assert _counts() == (2, 0, 0)   # torch.compile: 2


def test_writes_of_a_symbolic_attribute_replay_from_the_value_the_call_read():
    def f(x, c):
        c.n += 1
        c.n += 1
        c.m = c.n * 2
        return x + c.n
    x = torch.arange(4.)
    fast = tempa.compile(f, backend="eager")
    for n in range(5):
        want_c, got_c = Counter(n), Counter(n)
        assert torch.equal(fast(x, got_c), f(x, want_c))
        assert vars(got_c) == vars(want_c)
    assert _counts() == (2, 0, 0)   # torch.compile: 2


def test_ints_compiled_by_the_tempa_backend_take_the_symbol_as_an_input():
    def f(x, c):
        return (x * c.n).sum() + c.n
    x = torch.arange(6.)
    fast = tempa.compile(f)
    for n in range(5):
        assert torch.equal(fast(x, Counter(n)), f(x, Counter(n)))
    assert _counts() == (2, 0, 0)
