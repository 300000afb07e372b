"""The caller's plain objects (a KV cache, its layers) are guarded by class and by what the
code read through them, at their source (``cache.layers[0].k``), not by identity: a new
object of the same structure, as every ``generate()`` makes, finds the same graph. A use
that depends on which object it is (``is``, a dict key, ``id()``, the default ``repr``, ``==``
without ``__eq__``) guards it by identity. torch.compile does the same (TYPE_MATCH on
user objects, their tensors read by source): one graph for the first four tests."""
import collections

import pytest
import torch

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


class Layer:
    def __init__(self, k):
        self.k = k

    def update(self, x):
        self.k = torch.cat([self.k, x])
        return self.k


class Cache:
    def __init__(self, n):
        self.layers = [Layer(torch.zeros(2)) for _ in range(n)]
        self.steps = 0


def _captures():
    return tempa.stats().captures


def test_a_new_object_of_the_same_structure_reuses_the_graph():
    def step(cache, x):
        out = [layer.update(x * i) for i, layer in enumerate(cache.layers)]
        cache.steps = cache.steps + 1
        return out[-1].sum(), cache

    f = tempa.compile(step, backend="eager")
    for seed in range(3):
        eager_cache, cache = Cache(2), Cache(2)
        x = torch.full((2,), float(seed + 1))
        want_sum, _ = step(eager_cache, x)
        got_sum, got = f(cache, x)
        assert got is cache                       # the caller's object, not the first one
        torch.testing.assert_close(got_sum, want_sum)
        for a, b in zip(cache.layers, eager_cache.layers):   # the writes landed on it
            torch.testing.assert_close(a.k, b.k)
        assert cache.steps == 1
    assert _captures() == 1
    assert tempa.stats().graph_breaks == 0


def test_another_class_or_structure_is_a_new_graph():
    class Other(Layer):
        def update(self, x):
            return self.k - x

    def step(cache, x):
        return cache.layers[0].update(x)

    f = tempa.compile(step, backend="eager")
    f(Cache(1), torch.ones(2))
    c = Cache(1)
    c.layers[0] = Other(torch.zeros(2))
    torch.testing.assert_close(f(c, torch.ones(2)), -torch.ones(2))
    c = Cache(1)
    c.layers[0].update = lambda x: x * 10     # an instance attribute shadows the method
    torch.testing.assert_close(f(c, torch.ones(2)), torch.full((2,), 10.0))
    assert _captures() == 3


def test_two_arguments_that_are_one_object():
    def step(a, b, x):
        a.layers[0].k = x
        return b.layers[0].k + 1      # reads what the write left when a is b

    f = tempa.compile(step, backend="eager")
    torch.testing.assert_close(f(Cache(1), Cache(1), torch.ones(2)), torch.ones(2))
    c = Cache(1)
    torch.testing.assert_close(f(c, c, torch.ones(2)), torch.full((2,), 2.0))
    assert _captures() == 2


def test_the_same_object_reached_twice_stays_one():
    def step(cache, layer, x):
        layer.k = x
        return cache.layers[0].k * 2

    f = tempa.compile(step, backend="eager")
    c = Cache(1)
    torch.testing.assert_close(f(c, c.layers[0], torch.ones(2)), torch.full((2,), 2.0))
    c = Cache(1)
    torch.testing.assert_close(f(c, c.layers[0], torch.ones(2)), torch.full((2,), 2.0))
    assert _captures() == 1
    c = Cache(1)
    torch.testing.assert_close(f(c, Layer(torch.zeros(2)), torch.ones(2)), torch.zeros(2))
    assert _captures() == 2


@pytest.mark.parametrize("use", ["is", "eq", "dict-key", "id", "repr", "in"])
def test_uses_that_depend_on_which_object_it_is(use):
    def step(a, b, x):
        if use == "is":
            same = a is b
        elif use == "eq":
            same = a == b
        elif use == "dict-key":
            same = {a: 1}.get(b, 0) == 1
        elif use == "id":
            same = id(a) == id(b)
        elif use == "repr":
            same = repr(a) == repr(b)
        else:
            same = b in [a]
        return x + 1 if same else x - 1

    f = tempa.compile(step, backend="eager")
    x = torch.zeros(2)
    a = Layer(x)
    torch.testing.assert_close(f(a, a, x), x + 1)
    torch.testing.assert_close(f(a, Layer(x), x), x - 1)
    c = Layer(x)
    torch.testing.assert_close(f(c, c, x), x + 1)
    assert tempa.stats().captures >= 2   # captured: the identity use pinned the objects
    torch.testing.assert_close(f(Layer(x), Layer(x), x), x - 1)


SHARED = Layer(torch.zeros(2))


def test_an_argument_that_is_also_a_global():
    def step(layer, x):
        layer.k = x
        return SHARED.k + 1         # the write is seen here only when layer is SHARED

    f = tempa.compile(step, backend="eager")
    torch.testing.assert_close(f(SHARED, torch.ones(2)), torch.full((2,), 2.0))
    SHARED.k = torch.zeros(2)
    torch.testing.assert_close(f(Layer(torch.zeros(2)), torch.ones(2)), torch.ones(2))
    assert tempa.stats().captures >= 1 and tempa.stats().eager_fallbacks == 0


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_items_a_c_method_reads_from_a_callers_dict_subclass_are_guarded(backend):
    """``dict(out.items())`` on the caller's dict subclass (guarded by type, so the C
    method runs on the real object) returned its items as they were at capture: a later
    call whose dict held another tensor, or another number, computed on the first ones."""
    class Out(collections.OrderedDict):
        pass

    def f(out, x):
        d = dict(out.items())
        return d["a"] * d["n"] + x

    out, x = Out(a=torch.ones(3), n=2), torch.zeros(3)
    fast = tempa.compile(f, backend=backend)
    assert torch.equal(fast(out, x), f(out, x))
    out["a"].add_(1)                      # the same tensor, written in place
    assert torch.equal(fast(out, x), f(out, x))
    out["a"] = torch.full((3,), 7.0)      # another tensor
    assert torch.equal(fast(out, x), f(out, x))
    out["n"] = 3                          # another number
    assert torch.equal(fast(out, x), f(out, x))
    assert tempa.stats().graph_breaks == 0 and tempa.stats().captures >= 1


def test_a_write_through_a_c_method_of_a_callers_list_subclass_runs_once():
    """``lst.append(4)`` on the caller's list subclass runs on the real list at capture; its
    items are not guarded as a read (they would be the items after the write, which the
    capture's own check then finds changed, and the call ran eagerly: a second append)."""
    class MyList(list):
        def twice_the_length(self):
            return len(self) * 2

    def f(x, lst):
        lst.append(4)
        return x * lst.twice_the_length()

    x = torch.ones(2)
    want_list, got_list = MyList([1, 2, 3]), MyList([1, 2, 3])
    want = f(x, want_list)
    got = tempa.compile(f, backend="eager", fullgraph=True)(x, got_list)
    assert torch.equal(got, want) and got_list == want_list == [1, 2, 3, 4]
    assert tempa.stats().captures == 1 and tempa.stats().eager_fallbacks == 0
