"""Side effects as data (capture/side_effects.py): writes to objects that live outside the
compiled call are recorded during capture, seen by later reads in the same capture, and
applied after the graph runs, under fullgraph=True (no graph break, no eager fallback).
Each test checks the values, the outside object's state after the call, and which path ran.
torch.compile's counts on the same code, measured in a separate script (torch 2.13 CPU),
are quoted where they differ from one graph."""
import collections
import copy

import pytest
import torch
import torch.nn as nn

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


class Box:
    pass


def test_module_counter_is_written_after_each_call_and_the_next_call_sees_it():
    # The second value makes self.n a symbol (automatic dynamic for ints): one graph serves
    # every later value. torch.compile keeps ints on modules static (one graph per value of
    # self.n, 8 frames for 10 calls, then eager).
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = 0
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.n += 1
            return self.lin(x) * self.n

    m = M()
    fast = tempa.compile(m, fullgraph=True, backend="eager")
    for i in range(1, 4):
        x = torch.randn(2, 4)
        assert torch.allclose(fast(x), m.lin(x) * i)
        assert m.n == i
    assert _counts() == (2, 0, 0)


def test_tensor_attribute_on_outside_object_is_read_back_and_written_from_graph_output():
    box = Box()
    box.t = None

    def f(x):
        box.t = x * 2
        return box.t + 1

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    for _ in range(2):
        x = torch.randn(3)
        assert torch.equal(fast(x), x * 2 + 1)
        assert torch.equal(box.t, x * 2)
    # the tensor is a graph input by source (metadata guards): the new one does not recompile
    assert _counts() == (1, 0, 0)


def test_ema_buffer_assignment_and_in_place_update():
    class EMA(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("avg", torch.zeros(3))
            self.register_buffer("avg2", torch.zeros(3))

        def forward(self, x):
            self.avg.mul_(0.5).add_(x)          # in place
            self.avg2 = self.avg2 * 0.5 + x     # by assignment: a new buffer after the call
            return self.avg + self.avg2

    m, ref = EMA(), EMA()
    fast = tempa.compile(m, fullgraph=True, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        assert torch.allclose(fast(x), ref(x))
        assert torch.allclose(m.avg, ref.avg) and torch.allclose(m.avg2, ref.avg2)
    assert "avg2" in m._buffers
    # avg2, assigned anew, is read by source: one graph (torch.compile: 1 graph too)
    assert _counts() == (1, 0, 0)


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_a_buffer_assigned_anew_on_every_call_is_read_by_source(backend):
    """``self.avg = ...`` and ``self.k = torch.cat([self.k, x])`` on a module's buffers:
    each call leaves a new tensor there. Bound by identity (and the entry dropped by the
    replayed write's registration hook), every call recaptured, and after 8 the module ran
    eagerly. Capture sees the assignment and reads both by source (a second pass of the
    first capture). torch.compile (a counting backend, torch 2.13): 8 graphs in 12 calls,
    its recompile limit."""
    class Running(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("avg", torch.zeros(3))
            self.register_buffer("k", torch.zeros(0, 3))

        def forward(self, x):
            self.avg = self.avg * 0.9 + x * 0.1
            self.k = torch.cat([self.k, x[None]])
            return self.avg + self.k.sum(0)

    m, ref = Running(), Running()
    fast = tempa.compile(m, backend=backend)
    for _ in range(12):
        x = torch.randn(3)
        torch.testing.assert_close(fast(x), ref(x))
        torch.testing.assert_close((m.avg, m.k), (ref.avg, ref.k))
    # k of size 0, of size 1 (both specialised, as in torch.compile), then k's size symbolic
    assert _counts() == (3, 0, 0)
    assert tempa.stats().recompiles == 2
    assert any("self.k is a Tensor" in g for e in tempa.entries(fast) for g in e.guards)
    m.avg = torch.zeros(3, dtype=torch.float64)    # another kind of tensor: guarded
    ref.avg = torch.zeros(3, dtype=torch.float64)
    # (fused kernels compute x * 0.1 of a float32 x in double, eager in float)
    torch.testing.assert_close(fast(x), ref(x), rtol=1e-6, atol=1e-7)
    assert m.avg.dtype == torch.float64


def test_cache_dict_item_assignment_on_module():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.cache = {}

        def forward(self, x, k):
            self.cache[k] = x.sin()
            return x + len(self.cache)

    m = M()
    fast = tempa.compile(m, fullgraph=True, backend="eager")
    x = torch.randn(3)
    assert torch.equal(fast(x, "a"), x + 1)
    assert list(m.cache) == ["a"] and torch.allclose(m.cache["a"], x.sin())
    assert torch.equal(fast(x, "b"), x + 2)   # the guard on the keys sees the first write
    assert list(m.cache) == ["a", "b"]
    assert _counts() == (2, 0, 0)


def test_list_append_of_tensors_into_outside_list():
    # torch.compile: one graph per length of the list as well
    out = []

    def f(x):
        out.append(x.cos())
        out.append(len(out))
        return x

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    x = torch.randn(3)
    assert fast(x) is x
    assert len(out) == 2 and torch.allclose(out[0], x.cos()) and out[1] == 1
    fast(x)
    assert len(out) == 4 and out[3] == 3
    assert _counts()[1:] == (0, 0)
    assert _counts() == (2, 0, 0)


STEP = 0


def test_global_assignment_and_deletion_are_applied_and_read_back():
    def f(x):
        global STEP, SCRATCH
        STEP = STEP + 1
        SCRATCH = x * 3
        y = SCRATCH + STEP
        del SCRATCH
        return y

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    for i in range(1, 3):
        x = torch.randn(3)
        assert torch.equal(fast(x), x * 3 + i)
        assert STEP == i and "SCRATCH" not in globals()
    assert _counts()[1:] == (0, 0)
    assert _counts() == (2, 0, 0)


def test_nonlocal_counter():
    def make():
        calls = 0

        def step(x):
            nonlocal calls
            calls += 1
            return x * calls

        return step, lambda: calls

    step, calls = make()
    fast = tempa.compile(step, fullgraph=True, backend="eager")
    for i in range(1, 3):
        x = torch.randn(3)
        assert torch.equal(fast(x), x * i) and calls() == i
    assert _counts()[1:] == (0, 0)
    assert _counts() == (2, 0, 0)


def test_setattr_and_delattr_on_outside_plain_object():
    box = Box()
    box.old = 1

    def f(x):
        setattr(box, "new", 5)
        delattr(box, "old")
        del box.new
        box.last = hasattr(box, "old") or hasattr(box, "new")
        return x + 1

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    fast(torch.zeros(1))
    assert vars(box) == {"last": False}
    assert _counts() == (1, 0, 0)


def test_caller_dict_methods_keep_eager_order_and_values():
    def f(x, d):
        del d["a"]
        d.update(c=x * 3)
        v = d.pop("b")
        d.setdefault("e", 7)
        d["a"] = x
        return x + v + d["e"]

    d, want = {"a": 1, "b": 2, "z": 0}, {"a": 1, "b": 2, "z": 0}
    fast = tempa.compile(f, fullgraph=True, backend="eager")
    x = torch.randn(3)
    assert torch.equal(fast(x, d), f(x, want))
    assert list(d) == list(want) == ["z", "c", "e", "a"]
    assert torch.equal(d["c"], want["c"]) and d["a"] is x and d["e"] == 7
    assert _counts() == (1, 0, 0)


def test_replay_reads_the_callers_state_from_before_the_writes():
    def f(d):
        d["b"] = d["a"]
        d["a"] = d["a"] * 2
        return d["b"]

    a = torch.randn(3)
    d = {"a": a}
    fast = tempa.compile(f, fullgraph=True, backend="eager")
    assert fast(d) is a
    assert d["b"] is a and torch.equal(d["a"], a * 2)
    assert _counts() == (1, 0, 0)


def test_defaultdict_missing_key_is_inserted():
    d = collections.defaultdict(list)

    def f(x):
        d["a"].append(x + 1)
        return len(d["a"])

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    x = torch.randn(3)
    assert fast(x) == 1 and torch.equal(d["a"][0], x + 1)
    assert fast(x) == 2 and len(d["a"]) == 2
    assert _counts()[1:] == (0, 0)
    assert _counts() == (2, 0, 0)


def test_writes_happen_before_the_eager_code_of_a_graph_break():
    box = Box()
    box.n = 0
    seen = []

    @tempa.disable
    def peek():
        seen.append(box.n)

    def f(x):
        box.n = 7
        peek()
        box.n = 8
        return x + 1

    fast = tempa.compile(f, backend="eager")
    fast(torch.zeros(1))
    assert seen == [7] and box.n == 8
    assert tempa.stats().graph_breaks == 1


def test_no_write_when_the_graph_raises():
    box = Box()

    def f(x, i):
        y = x[i]              # an out-of-range tensor index raises when the graph runs
        box.done = True
        return y

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(fast(torch.arange(3.0), torch.tensor([1])), torch.tensor([1.0]))
    assert box.done is True
    del box.done
    with pytest.raises(IndexError):
        fast(torch.arange(3.0), torch.tensor([5]))
    assert not hasattr(box, "done")
    assert _counts() == (1, 0, 0)


def test_write_to_an_objects_dict_through_a_set_only_descriptor_is_read_back():
    # obj.__dict__ is read as a copy; the attribute read must see what was written to it
    class Field:
        def __set__(self, obj, value):
            obj.__dict__["field"] += value * 2

    class Foo:
        field = Field()

        def __init__(self):
            self.__dict__["field"] = 0

    def f(x, foo):
        foo.field = 10
        return x + foo.field

    foo = Foo()
    assert tempa.compile(f, fullgraph=True, backend="eager")(torch.zeros(1), foo).item() == 20.0
    assert foo.__dict__ == {"field": 20}
    assert _counts() == (1, 0, 0)


def test_deleting_a_class_attribute_through_an_instance_raises_as_eager():
    class WithDefault:
        a = 1

    def f(x, obj):
        del obj.a
        return x

    fast = tempa.compile(f, backend="eager")
    with pytest.raises(AttributeError):
        fast(torch.zeros(1), WithDefault())
    assert WithDefault.a == 1
    assert _counts() == (1, 1, 0)


def test_outside_namedtuple_subclass_gets_the_attribute_and_is_returned_as_itself():
    class Pair(collections.namedtuple("Pair", "a b")):
        pass

    def f(tup):
        tup.c = tup.a + 1
        return tup

    p = Pair(torch.ones(1), torch.zeros(1))
    out = tempa.compile(f, fullgraph=True, backend="eager")(p)
    assert out is p and torch.equal(p.c, torch.full((1,), 2.0))
    assert _counts() == (1, 0, 0)


def test_instance_dict_writes_and_attribute_reads_agree():
    box = Box()
    box.a = 1

    def f(x, obj):
        obj.b = 2
        obj.__dict__["c"] = obj.a + obj.__dict__["b"]
        if "tracker" not in obj.__dict__:
            obj.__dict__["tracker"] = []
        obj.tracker.append(obj.c)
        del obj.a
        return x + obj.c

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(fast(torch.zeros(1), box), torch.full((1,), 3.0))
    assert vars(box) == {"b": 2, "c": 3, "tracker": [3]}
    assert _counts() == (1, 0, 0)


def test_python_descriptor_read_sees_the_pending_writes():
    class Desc:
        def __get__(self, obj, objtype=None):
            return self if obj is None else obj.__dict__.get("_v", "default")

        def __set__(self, obj, value):
            obj.__dict__["_v"] = f"set_{value}"

    class C:
        d = Desc()

    def f(x, obj):
        obj.d = "hello"
        first = obj.d
        obj.__dict__["_v"] = "direct"
        return x + len(first), obj.d

    c = C()
    out, text = tempa.compile(f, fullgraph=True, backend="eager")(torch.zeros(1), c)
    assert text == "direct" and out.item() == len("set_hello") and c.__dict__ == {"_v": "direct"}
    assert _counts() == (1, 0, 0)


def test_a_parameter_written_into_the_modules_table_is_what_the_module_then_reads():
    """``m._parameters["weight"] = w`` (what torch.func.functional_call does) and then
    ``m(x)``: the call uses ``w``. The module's attribute read found the table's entry in
    the real dict, from before the write, so the graph used the old weight."""
    def swap_then_call(m, x, w):
        m._parameters["weight"] = w
        return m(x)

    def removed_then_read(m):
        del m._buffers["running"]
        return m.running

    torch.manual_seed(0)
    x = torch.randn(4, 3)
    lin = nn.Linear(3, 2)
    lin_eager = copy.deepcopy(lin)
    fast = tempa.compile(swap_then_call, fullgraph=True)
    for _ in range(2):   # a new weight each call: its source is the argument
        w = nn.Parameter(torch.randn(2, 3))
        want = swap_then_call(lin_eager, x, w)
        got = fast(lin, x, w)
        torch.testing.assert_close(got, want)
        assert lin.weight is w
    # the table's entries are guarded by identity: the second weight recaptures, no break
    assert _counts() == (2, 0, 0)

    m = nn.Module()
    m.register_buffer("running", torch.zeros(2))
    with pytest.raises(AttributeError):
        tempa.compile(removed_then_read)(m)
    assert "running" not in m._buffers


def test_deleting_an_attribute_of_a_new_argument_each_call_reuses_the_graph():
    """``del box.old`` guards that ``old`` is an instance attribute of the object the
    argument names on each call; it was guarded in the first call's own ``__dict__``, which
    the replayed deletion emptied, so every later call recaptured (8 calls, then eager).
    torch.compile on the same code: 1 graph, 0 breaks."""
    def f(x, box):
        box.t = x * 2
        del box.old
        return box.t + 1

    fast = tempa.compile(f, fullgraph=True, backend="eager")
    for _ in range(3):
        box = Box()
        box.old = 1
        x = torch.randn(3)
        assert torch.equal(fast(x, box), x * 2 + 1)
        assert vars(box) == {"t": box.t} and torch.equal(box.t, x * 2)
    assert _counts() == (1, 0, 0)
    box = Box()                       # no attribute to delete: eager's AttributeError
    with pytest.raises(AttributeError):
        fast(torch.randn(3), box)
