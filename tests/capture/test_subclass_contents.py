"""The caller's container subclasses (``class Seq(list)``, a tuple subclass with its own
``__getitem__``, a dict subclass): what the code reads of them is this call's contents.

A list subclass was guarded by identity alone, and every read of it (C methods called bound
or unbound, ``list()``, ``sorted``, indexing, slicing, iteration, ``len``) was made once, at
capture: a later call whose list held another tensor, another number or another length got
the first call's result. Its writes (``seq.append``) ran on the caller's list at capture, once.
Now capture reads a copy of the same class, each item guarded at its source (tensors are
graph inputs), and writes the copy back after the graph, as for plain lists. Subclasses a
copy cannot stand for (a hash, slots) have their contents guarded where they are reached and
their writes break the graph; so do a dict or set subclass's writes.
"""
import collections

import pytest
import torch

import tempa


class Seq(list):
    pass


# Each reads the whole list through C code or the interpreter; the result depends on the
# tensor item, the number and the length.
READS = {
    "list.copy unbound": lambda seq: list.copy(seq),
    "copy bound": lambda seq: seq.copy(),
    "list()": lambda seq: list(seq),
    "tuple()": lambda seq: tuple(seq),
    "star": lambda seq: [*seq],
    "slice": lambda seq: seq[:],
    "list.__getitem__ unbound": lambda seq: [list.__getitem__(seq, i)
                                              for i in range(list.__len__(seq))],
    "__getitem__ bound": lambda seq: [seq.__getitem__(i) for i in range(len(seq))],
    "index": lambda seq: [seq[i] for i in range(len(seq))],
    "iteration": lambda seq: [v for v in seq],
    "enumerate": lambda seq: [v for _, v in enumerate(seq)],
    "reversed": lambda seq: list(reversed(seq))[::-1],
}


def _replace_tensor(seq):
    seq[0] = torch.full((2,), 5.0)


def _change_number(seq):
    seq[1] = 7.0


def _grow(seq):
    seq.append(1.0)


@pytest.mark.parametrize("change", [_replace_tensor, _change_number, _grow],
                         ids=["replace a tensor", "change a number", "change the length"])
@pytest.mark.parametrize("read", list(READS), ids=list(READS))
def test_each_read_of_a_callers_list_subclass_sees_this_calls_items(read, change):
    reader = READS[read]

    def f(x, seq):
        items = reader(seq)
        return x * items[0] * items[1] + len(items)

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    seq = Seq([torch.ones(2), 2.0])
    assert torch.equal(fast(x, seq), f(x, seq))
    change(seq)
    assert torch.equal(fast(x, seq), f(x, seq))
    assert tempa.stats().captures >= 1 and tempa.stats().graph_breaks == 0


NUMBER_READS = {
    "sorted": lambda seq: sorted(seq)[0],
    "in": lambda seq: float(2.0 in seq),
    "index method": lambda seq: float(seq.index(3.0)),
    "count method": lambda seq: float(seq.count(3.0)),
    "max": lambda seq: max(seq),
    "sum": lambda seq: sum(seq),
    "len": lambda seq: float(len(seq)),
    "list.__len__ unbound": lambda seq: float(list.__len__(seq)),
    "unpacking": lambda seq: (lambda first, *rest: first * len(rest))(*seq),
}


@pytest.mark.parametrize("read", list(NUMBER_READS), ids=list(NUMBER_READS))
def test_numbers_read_from_a_callers_list_subclass_are_this_calls(read):
    reader = NUMBER_READS[read]

    def f(x, seq):
        return x * reader(seq)

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    seq = Seq([3.0, 2.0])
    assert torch.equal(fast(x, seq), f(x, seq))
    for change in ([2.0, 3.0], [3.0, 3.0, 2.0], [5.0, 3.0], [3.0]):
        seq[:] = change
        assert torch.equal(fast(x, seq), f(x, seq)), change
    assert tempa.stats().captures >= 1 and tempa.stats().graph_breaks == 0


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_the_issue_case_list_copy_of_a_replaced_item(backend):
    def f(x, seq):
        return x * list.copy(seq)[0]

    fast = tempa.compile(f, backend=backend)
    x = torch.ones(2)
    seq = Seq([torch.ones(2), 2.0])
    assert torch.equal(fast(x, seq), x)
    seq[0] = torch.full((2,), 5.0)
    assert torch.equal(fast(x, seq), torch.full((2,), 5.0))
    assert tempa.stats().captures == 1   # a tensor item is an input: no recapture


def test_writes_to_a_callers_list_subclass_happen_on_every_call():
    """``seq.append`` ran on the caller's list at capture only; now it is written back
    after every call, and the reads after it see the write."""
    class Counted(list):
        def doubled_length(self):
            return len(self) * 2

    def f(x, seq):
        seq.append(float(len(seq)))
        list.__setitem__(seq, 0, seq[0] + 1.0)
        return x * seq.doubled_length() * sum(list.copy(seq))

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    got, want = Counted([1.0]), Counted([1.0])
    for _ in range(3):
        assert torch.equal(fast(x, got), f(x, want))
        assert got == want
    assert type(got) is Counted and tempa.stats().captures >= 1
    assert tempa.stats().graph_breaks == 0


def test_a_tensor_written_into_a_callers_list_subclass_is_this_calls():
    def f(x, seq):
        seq[1] = x * 2
        return list.copy(seq)[1] + seq[0]   # (None, then a tensor: a second capture)

    fast = tempa.compile(f, backend="eager")
    got, want = Seq([torch.ones(2), None]), Seq([torch.ones(2), None])
    for scale in (1.0, 3.0, 4.0):
        x = torch.full((2,), scale)
        assert torch.equal(fast(x, got), f(x, want))
        assert torch.equal(got[1], want[1])
    assert tempa.stats().captures == 2 and tempa.stats().graph_breaks == 0


def test_a_subclass_getitem_runs_neither_in_guards_nor_in_the_write_back():
    """A class whose own ``__getitem__``/``__setitem__`` must not run (as in PyTorch's
    test_udf_list): the guards and the write back use list's own methods."""
    class Strict(list):
        def __getitem__(self, i):
            raise RuntimeError("should not be called")

        def __setitem__(self, i, v):
            raise RuntimeError("should not be called")

    def f(x, seq):
        seq.append(4.0)
        return x * sum(list.copy(seq))

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    got, want = Strict([1.0, 2.0]), Strict([1.0, 2.0])
    assert torch.equal(fast(x, got), f(x, want))
    list.__setitem__(got, 0, 10.0)
    list.__setitem__(want, 0, 10.0)
    assert torch.equal(fast(x, got), f(x, want))
    assert list.copy(got) == list.copy(want) and tempa.stats().captures >= 1


def test_the_caller_gets_its_own_list_subclass_back():
    def f(x, seq):
        seq.append(x)
        return seq

    fast = tempa.compile(f, backend="eager")
    seq = Seq([])
    assert fast(torch.ones(1), seq) is seq and fast(torch.ones(1), seq) is seq
    assert len(seq) == 2 and tempa.stats().captures >= 1


def test_a_list_subclass_across_a_graph_break():
    def f(x, seq):
        seq.append(3.0)
        print("break")
        seq.append(4.0)
        return x * len(seq) * seq[0]

    fast = tempa.compile(f, backend="eager")
    got, want = Seq([1.0]), Seq([1.0])
    for _ in range(2):
        assert torch.equal(fast(torch.ones(1), got), f(torch.ones(1), want))
        got[0] += 1.0
        want[0] += 1.0
    assert got == want and tempa.stats().graph_breaks >= 1 and tempa.stats().captures >= 2


def test_a_patched_method_of_a_list_subclass_is_seen():
    class Totals(list):
        def total(self):
            return sum(self)

    def f(x, seq):
        return x * seq.total()

    fast = tempa.compile(f, backend="eager")
    seq = Totals([1.0, 2.0])
    assert torch.equal(fast(torch.ones(1), seq), torch.tensor([3.0]))
    Totals.total = lambda self: 100.0
    assert torch.equal(fast(torch.ones(1), seq), torch.tensor([100.0]))
    assert tempa.stats().captures == 2


def test_a_list_subclass_held_by_a_module():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = Seq([2.0])

        def forward(self, x):
            self.seq.append(1.0)
            return x * sorted(self.seq)[-1]

    got, want = M(), M()
    fast = tempa.compile(got, backend="eager")
    for _ in range(3):
        assert torch.equal(fast(torch.ones(1)), want(torch.ones(1)))
        got.seq[0] += 5.0
        want.seq[0] += 5.0
    assert got.seq == want.seq and tempa.stats().captures >= 1


def test_a_tuple_subclass_with_its_own_getitem_holding_a_list():
    """A tuple subclass whose ``__getitem__`` is its own was guarded by identity: the list
    it holds was read once at capture."""
    class Pair(tuple):
        def __getitem__(self, i):
            return tuple.__getitem__(self, i)

    def f(x, pair):
        return x * pair[0][0] * len(tuple(pair)[1])

    fast = tempa.compile(f, backend="eager")
    pair = Pair(([1.0], [0, 0]))
    assert torch.equal(fast(torch.ones(1), pair), f(torch.ones(1), pair))
    pair[0][0] = 9.0
    pair[1].append(0)
    assert torch.equal(fast(torch.ones(1), pair), f(torch.ones(1), pair))
    assert tempa.stats().captures >= 1 and tempa.stats().graph_breaks == 0


def test_a_namedtuple_holding_a_list():
    Point = collections.namedtuple("Point", "xs scale")

    def f(x, p):
        return x * list(p)[0][0] * p.scale

    fast = tempa.compile(f, backend="eager")
    p = Point([1.0], 2.0)
    assert torch.equal(fast(torch.ones(1), p), f(torch.ones(1), p))
    p.xs[0] = 4.0
    assert torch.equal(fast(torch.ones(1), p), f(torch.ones(1), p))
    assert tempa.stats().captures >= 1


def test_a_hashable_list_subclass_is_guarded_item_by_item_and_its_writes_break():
    """A list subclass with a hash (a dict may hold it by identity) is not copied: its
    items are guarded where it is reached, and a write breaks the graph (it ran once, on the
    caller's list, at capture)."""
    class Keyed(list):
        __hash__ = object.__hash__

    def reads(x, seq):
        return x * seq[0] * len(list.copy(seq))

    fast = tempa.compile(reads, backend="eager")
    seq = Keyed([1.0, 2.0])
    assert torch.equal(fast(torch.ones(1), seq), reads(torch.ones(1), seq))
    seq[0] = 6.0
    assert torch.equal(fast(torch.ones(1), seq), reads(torch.ones(1), seq))
    seq.append(3.0)
    assert torch.equal(fast(torch.ones(1), seq), reads(torch.ones(1), seq))
    assert tempa.stats().captures == 3 and tempa.stats().graph_breaks == 0

    def writes(x, seq):
        seq.append(1.0)
        return x * len(seq)

    fast = tempa.compile(writes, backend="eager")
    got, want = Keyed([]), Keyed([])
    for _ in range(2):
        assert torch.equal(fast(torch.ones(1), got), writes(torch.ones(1), want))
    assert got == want == [1.0, 1.0] and tempa.stats().graph_breaks >= 1


@pytest.mark.parametrize("write", ["item", "update"])
def test_a_write_to_a_callers_dict_subclass_breaks_the_graph(write):
    """``d["n"] = ...`` on the caller's dict subclass ran on the real dict at capture, and
    the capture's own guards then failed: the call ran again eagerly and wrote twice."""
    class Config(dict):
        pass

    def f(x, d):
        n = d.get("n", 0) + 1
        if write == "item":
            d["n"] = n
        else:
            d.update(n=n)
        return x * d["n"]

    fast = tempa.compile(f, backend="eager")
    got, want = Config(a=1), Config(a=1)
    for _ in range(3):
        assert torch.equal(fast(torch.ones(1), got), f(torch.ones(1), want))
        assert got == want
    assert tempa.stats().graph_breaks >= 1 and tempa.stats().captures >= 1


def test_a_write_to_a_callers_set_subclass_breaks_the_graph():
    class Tags(set):
        pass

    def f(x, tags):
        tags.add(len(tags))
        return x * len(tags)

    fast = tempa.compile(f, backend="eager")
    got, want = Tags({100}), Tags({100})
    for _ in range(3):
        assert torch.equal(fast(torch.ones(1), got), f(torch.ones(1), want))
    assert got == want and tempa.stats().graph_breaks >= 1


class Registry(dict):
    """A library's registry kept as a global (transformers' ``_CAN_RECORD_REGISTRY``)."""

    def get(self, key):
        return super().get(key) or {}


REGISTRY = Registry(a={"scale": 2.0})


def test_a_container_inside_a_global_dict_subclass_is_guarded():
    """The dict a registry holds was read by the class's ``get`` (C code, on the real
    registry) and then natively: only the registry's items were guarded, by identity, so a
    change inside the dict it holds was missed."""
    def f(x):
        return x * REGISTRY.get("a")["scale"]

    fast = tempa.compile(f, backend="eager")
    try:
        assert torch.equal(fast(torch.ones(1)), torch.tensor([2.0]))
        REGISTRY["a"]["scale"] = 3.0
        assert torch.equal(fast(torch.ones(1)), torch.tensor([3.0]))
        assert tempa.stats().captures == 2 and tempa.stats().graph_breaks == 0
    finally:
        REGISTRY["a"] = {"scale": 2.0}


def test_a_write_inside_a_global_dict_subclass_breaks_the_graph():
    def f(x):
        entry = REGISTRY.get("a")
        entry["calls"] = entry.get("calls", 0) + 1
        return x * entry["calls"]

    fast = tempa.compile(f, backend="eager")
    try:
        for calls in (1, 2, 3):
            assert torch.equal(fast(torch.ones(1)), torch.tensor([float(calls)]))
            assert REGISTRY["a"]["calls"] == calls
        assert tempa.stats().graph_breaks >= 1
    finally:
        REGISTRY["a"] = {"scale": 2.0}


# -- what the class answers on a copied list subclass: guarded as the class holds it ------

class Scaled(list):
    @classmethod
    def by_class(cls):
        return 2.0

    @staticmethod
    def by_static():
        return 2.0

    @property
    def by_property(self):
        return 2.0 * len(self)


_CLASS_READS = {
    "classmethod": (lambda seq: seq.by_class(), "by_class", classmethod(lambda cls: 10.0)),
    "staticmethod": (lambda seq: seq.by_static(), "by_static", staticmethod(lambda: 10.0)),
    "property": (lambda seq: seq.by_property, "by_property", property(lambda self: 10.0)),
}


@pytest.mark.parametrize("read", list(_CLASS_READS))
def test_a_patched_descriptor_of_a_copied_list_subclass_is_seen(read, monkeypatch):
    reader, name, patched = _CLASS_READS[read]

    def f(x, seq):
        return x * reader(seq) * len(seq)

    fast = tempa.compile(f, backend="eager")
    seq = Scaled([1.0])
    assert torch.equal(fast(torch.ones(1), seq), f(torch.ones(1), seq))
    monkeypatch.setattr(Scaled, name, patched)
    assert torch.equal(fast(torch.ones(1), seq), torch.tensor([10.0]))
    assert tempa.stats().captures == 2 and tempa.stats().graph_breaks == 0


def test_a_copied_list_subclass_getattr_runs_traced_on_every_call():
    """A class ``__getattr__`` answering a missing name ran natively at capture and again in
    the guard that checked its value; it now runs traced on the copy: its value is this
    call's, its side effect happens once per call as in eager, and a patched one is seen."""
    calls = []

    class Lazy(list):
        def __getattr__(self, name):
            calls.append(name)
            return self[0] * 2

    def f(x, seq):
        return x * seq.doubled

    fast = tempa.compile(f, backend="eager")
    seq = Lazy([torch.ones(1)])
    assert torch.equal(fast(torch.ones(1), seq), torch.full((1,), 2.0))
    seq[0] = torch.full((1,), 3.0)
    assert torch.equal(fast(torch.ones(1), seq), torch.full((1,), 6.0))
    assert calls == ["doubled", "doubled"]   # once per call, as eager (not in guards)
    Lazy.__getattr__ = lambda self, name: self[0] * 5
    assert torch.equal(fast(torch.ones(1), seq), torch.full((1,), 15.0))
    assert tempa.stats().captures >= 2 and tempa.stats().graph_breaks == 0


# -- an output record (a ModelOutput: an OrderedDict subclass) read by C code -------------

def _output_record():
    import dataclasses
    from transformers.utils import ModelOutput

    @dataclasses.dataclass
    class Out(ModelOutput):
        logits: torch.Tensor = None
        extras: list = None

    return Out


_RECORD_READS = {
    "to_tuple": lambda out: out.to_tuple()[1][0],
    "key": lambda out: out["extras"][0],
    "index": lambda out: out[1][0],
    "items": lambda out: dict(out.items())["extras"][0],
    "values": lambda out: list(out.values())[1][0],
    "dict()": lambda out: dict(out)["extras"][0],
    "OrderedDict()": lambda out: collections.OrderedDict(out)["extras"][0],
    "unpacked": lambda out: {**out}["extras"][0],
    "copy.copy": lambda out: __import__("copy").copy(out)["extras"][0],
    "sum of the list": lambda out: sum(out.to_tuple()[1]),
}


@pytest.mark.parametrize("read", list(_RECORD_READS))
def test_a_list_inside_an_output_record_read_by_c_code_is_this_calls(read):
    """C code reading a ModelOutput's items (``dict(self.items())`` in its ``__getitem__``,
    ``dict(out)``, ``{**out}``, ``copy.copy``) hands the code the caller's own list: only
    the record's own items were guarded, so a change inside the list was missed."""
    pytest.importorskip("transformers")
    reader = _RECORD_READS[read]

    def f(x, out):
        return x * reader(out)

    fast = tempa.compile(f, backend="eager")
    out = _output_record()(logits=torch.ones(1), extras=[1.0, 2.0])
    assert torch.equal(fast(torch.ones(1), out), f(torch.ones(1), out))
    out["extras"][0] = 5.0
    assert torch.equal(fast(torch.ones(1), out), f(torch.ones(1), out))
    out["extras"].append(4.0)
    assert torch.equal(fast(torch.ones(1), out), f(torch.ones(1), out))
    assert tempa.stats().captures >= 2


@pytest.mark.parametrize("read", ["dict()", "unpacked", "copy.copy"])
def test_a_tensor_of_an_output_record_copied_by_c_code_is_this_calls(read):
    pytest.importorskip("transformers")
    reader = {"dict()": lambda out: dict(out)["logits"], "unpacked": lambda out: {**out}["logits"],
              "copy.copy": lambda out: __import__("copy").copy(out)["logits"]}[read]

    def f(x, out):
        return x * reader(out)

    fast = tempa.compile(f, backend="eager")
    out = _output_record()(logits=torch.ones(1), extras=[])
    assert torch.equal(fast(torch.ones(1), out), torch.ones(1))
    dict.__setitem__(out, "logits", torch.full((1,), 3.0))
    assert torch.equal(fast(torch.ones(1), out), torch.full((1,), 3.0))
    assert tempa.stats().captures >= 1 and tempa.stats().eager_fallbacks == 0, tempa.stats()


class _Settings:
    pass


@pytest.mark.parametrize("change", ["nested", "number", "tensor"])
def test_copy_copy_of_a_callers_plain_object_is_this_calls(change):
    """``copy.copy(obj)`` reads the object's attributes in C into an object of the capture,
    whose reads were not guarded."""
    import copy

    def f(x, s):
        c = copy.copy(s)
        return x * c.table["a"][0] * c.scale * c.weight

    def make():
        s = _Settings()
        s.table, s.scale, s.weight = {"a": [1.0]}, 2.0, torch.ones(1)
        return s

    fast = tempa.compile(f, backend="eager")
    s = make()
    assert torch.equal(fast(torch.ones(1), s), f(torch.ones(1), s))
    if change == "nested":
        s.table["a"][0] = 5.0
    elif change == "number":
        s.scale = 7.0
    else:
        s.weight = torch.full((1,), 3.0)
    assert torch.equal(fast(torch.ones(1), s), f(torch.ones(1), s))
    assert tempa.stats().captures >= 1 and tempa.stats().eager_fallbacks == 0, tempa.stats()


def test_a_callers_deque_read_as_itself_is_this_calls():
    def f(x, d):
        return x * d[0][0] * len(d)

    fast = tempa.compile(f, backend="eager")
    d = collections.deque([[1.0]])
    assert torch.equal(fast(torch.ones(1), d), f(torch.ones(1), d))
    d[0][0] = 5.0
    assert torch.equal(fast(torch.ones(1), d), f(torch.ones(1), d))
    d.append([2.0])
    assert torch.equal(fast(torch.ones(1), d), f(torch.ones(1), d))
    assert tempa.stats().captures == 3 and tempa.stats().graph_breaks == 0
