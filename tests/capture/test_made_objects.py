"""Objects the compiled code makes or is handed (namedtuples, structseqs, user classes with
operators): each test compares compiled calls with eager, over calls whose inputs change,
and checks which path ran (tempa.stats(): captures, graph_breaks, eager_fallbacks)."""
import collections
import functools
import typing

import pytest
import torch

import tempa
from tests.capture.paths import counts


@pytest.fixture(autouse=True)
def _reset():
    tempa.reset()
    yield
    tempa.reset()


class Pair(typing.NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


class PairWithAttrs(Pair):   # no __slots__: instances take attributes
    pass


def _inputs(n=3):
    return [torch.full((2,), float(i)) for i in range(n)]


# -- namedtuples and tuple subclasses made inside the compiled code -----------------------

def test_namedtuple_made_inside_keeps_an_attribute_set_on_it():
    def f(x):
        tup = PairWithAttrs(a=x + 1, b=x * 2)
        tup.c = x - 1
        return tup

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    for x in _inputs():
        r, e = fast(x), f(x)
        assert type(r) is PairWithAttrs
        assert torch.equal(r.a, e.a) and torch.equal(r.b, e.b) and torch.equal(r.c, e.c)
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.eager_fallbacks) == (1, 0, 0)


def test_tuple_new_with_a_subclass_and_tensors_is_captured():
    class MyTuple(tuple):
        pass

    def f(x, klass):
        t = tuple.__new__(klass, [x * 2])
        if isinstance(t, MyTuple):
            t.attr = 3
        return t

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(4)
    r = fast(x, MyTuple)
    assert type(r) is MyTuple and r.attr == 3 and torch.equal(r[0], x * 2)
    r = fast(x, tuple)
    assert type(r) is tuple and torch.equal(r[0], x * 2)
    assert tempa.stats().graph_breaks == 0
    assert counts() == (2, 0, 1, 0)


def test_collections_namedtuple_class_is_new_on_every_call_as_in_eager():
    def f(x):
        P = collections.namedtuple("P", ["x", "y"], defaults=(None,))
        p = P(x)
        q = p._replace(y=x * 3)
        return q, P

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    (q1, P1), (q2, P2) = fast(torch.ones(2)), fast(torch.zeros(2))
    assert type(q1) is P1 and type(q2) is P2 and P1 is not P2   # eager: a new class per call
    assert P1._fields == ("x", "y") and P1.__module__ == __name__
    assert torch.equal(q2.y, torch.zeros(2)) and torch.equal(q1.y, torch.full((2,), 3.0))
    s = tempa.stats()
    assert (s.captures, s.graph_breaks) == (1, 0)


def test_namedtuple_crossing_a_break_keeps_its_attributes_and_identity():
    def f(x):
        tup = PairWithAttrs(a=x + 1, b=x * 2)
        print(end="")                    # graph break: `tup` is handed to the resume
        tup.c = x - 1
        return tup

    fast = tempa.compile(f, backend="eager")
    for x in _inputs():
        r, e = fast(x), f(x)
        assert torch.equal(r.a, e.a) and torch.equal(r.c, e.c)
    # the resume function is handed a new namedtuple on every call: guarded by its items,
    # not by identity (which recompiled on every call)
    assert tempa.stats().recompiles == 0
    assert counts() == (2, 1, 0, 0)


# -- namedtuples and structseqs handed in -------------------------------------------------

def test_namedtuple_argument_is_guarded_by_its_items_and_returned_as_itself():
    def f(t):
        return t.a + t.b, t

    fast = tempa.compile(f, backend="eager")
    for i in range(3):
        t = Pair(torch.full((2,), float(i)), torch.ones(2))
        total, same = fast(t)
        assert same is t and torch.equal(total, t.a + 1)
    assert tempa.stats().captures == 1
    t = PairWithAttrs(torch.ones(2), torch.ones(2))
    t.extra = 1
    assert fast(t)[1] is t             # another class: a new capture, still itself
    assert tempa.stats().captures == 2


def test_structseq_across_a_break_is_not_guarded_by_identity():
    def f(x):
        result = torch.max(x, dim=0)
        print(end="")                    # graph break: `result` is handed to the resume
        return result.values * 2, result

    fast = tempa.compile(f, backend="eager")
    for i in range(3):
        x = torch.randn(3, 2) + i
        values, result = fast(x)
        assert torch.equal(values, x.max(0).values * 2)
        assert torch.equal(result.indices, x.max(0).indices)
    assert tempa.stats().recompiles == 0
    assert counts() == (2, 1, 0, 0)


def test_structseq_built_from_tensors_is_captured():
    def f(x, y):
        return torch.return_types.max((x, y)), tuple(torch.return_types.qr((2 * x, y - 1)))

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    x, y = torch.randn(3, 2), torch.randn(2, 4)
    (m, q), (em, eq) = fast(x, y), f(x, y)
    assert type(m) is type(em) and torch.equal(m.indices, y)
    assert torch.equal(q[0], eq[0]) and torch.equal(q[1], eq[1])
    assert counts() == (1, 0, 0, 0)


# -- user classes defining operators -----------------------------------------------------

class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + (other.t if isinstance(other, Vec) else other))

    def __radd__(self, other):
        return Vec(self.t + other * 10)

    def __neg__(self):
        return Vec(-self.t)

    def __lt__(self, other):
        return self.t.shape[0] < other.t.shape[0]

    def __len__(self):
        return self.t.shape[0]


class ScaledVec(Vec):
    def __radd__(self, other):          # a subclass's reflected method is tried first
        return ScaledVec(self.t * 100)


def test_user_operators_run_traced_not_at_capture():
    def f(a, b):
        c = a
        c += b
        return [(a + b).t, (3 + a).t, (-a).t, (a + ScaledVec(b.t)).t, a < b, bool(a), c.t]

    x = torch.ones(2)
    a, b = Vec(x), Vec(x * 2)
    fast = tempa.compile(f, backend="eager", fullgraph=True)
    for _ in range(2):
        for r, e in zip(fast(a, b), f(a, b)):
            assert torch.equal(r, e) if isinstance(e, torch.Tensor) else r == e
        x.add_(10)       # the old answer was computed once at capture on the real tensors
    assert tempa.stats().captures == 1
    a.t = torch.zeros(2)   # a tensor attribute is a graph input read by its source
    assert torch.equal(fast(a, b)[0], f(a, b)[0])
    s = tempa.stats()
    assert (s.captures, s.graph_breaks) == (1, 0)


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_user_operator_missing_raises_eagers_type_error():
    def f(a, b):
        return a - b

    fast = tempa.compile(f, backend="eager")
    with pytest.raises(TypeError, match="unsupported operand type"):
        fast(Vec(torch.ones(1)), Vec(torch.ones(1)))


# -- graphs with nothing to compute -------------------------------------------------------

def test_graph_with_no_operation_is_not_handed_to_the_backend():
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm

    def f(x):
        y = x * 2
        print(end="")                    # graph break; the resume only returns `y`
        return y

    fast = tempa.compile(f, backend=counting)
    assert torch.equal(fast(torch.ones(2)), torch.full((2,), 2.0))
    assert len(graphs) == 1 and tempa.stats().captures == 2


# -- functools.partial --------------------------------------------------------------------

def _mul(x, y):
    return x * y


def test_partial_over_tensors_made_inside_crosses_a_break():
    def f(x):
        by_keyword = functools.partial(_mul, y=x + 1)
        by_position = functools.partial(_mul, x * 2)
        print(end="")                    # graph break: both partials are handed on
        return by_keyword(x) * by_position(y=x), by_keyword

    fast = tempa.compile(f, backend="eager")
    for x in _inputs():
        (r, p), (e, ep) = fast(x), f(x)
        assert torch.equal(r, e) and torch.equal(p.keywords["y"], ep.keywords["y"])
    s = tempa.stats()
    # captured on both sides of the break (it ran eagerly: a partial over tensors was refused)
    assert (s.captures, s.recompiles, s.eager_fallbacks) == (2, 0, 0)


def test_partial_arguments_are_guarded_by_func_and_arguments_not_identity():
    def f(f0, f1, x):
        return f0(x) * f1(x)

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    a, b = functools.partial(_mul, y=torch.ones(2)), functools.partial(_mul, y=torch.full((2,), 3.0))
    x = torch.ones(2)
    assert torch.equal(fast(a, b, x), f(a, b, x)) and torch.equal(fast(b, a, x), f(b, a, x))
    assert tempa.stats().captures == 1       # swapped partials: same functions, same shapes
    b.keywords["y"] = torch.full((2,), 5.0)  # a partial's keywords are a dict the caller may change
    assert torch.equal(fast(a, b, x), f(a, b, x))
    c = functools.partial(lambda x, y: x - y, y=torch.ones(2))
    assert torch.equal(fast(c, c, x), f(c, c, x))
    assert tempa.stats().captures == 2       # another function: a new capture


# -- internal errors met by the Dynamo tests ----------------------------------------------

def test_argument_whose_getattr_raises_key_error_is_captured():
    class Config(dict):
        def __getattr__(self, name):      # every missing attribute, __self__ too: KeyError
            return self[name]

    def f(cfg, x):
        return x + cfg.offset

    fast = tempa.compile(f, backend="eager")
    cfg, x = Config(offset=5), torch.ones(2)
    assert torch.equal(fast(cfg, x), x + 5)
    cfg["offset"] = 7                    # the value read is guarded
    assert torch.equal(fast(cfg, x), x + 7)
    s = tempa.stats()
    assert (s.captures, s.eager_fallbacks) == (2, 0)


def test_python_scalar_types_as_dtypes():
    def f(x):
        return (x * 5).to(bool).to(float).to(int) + 8, torch.zeros(2, dtype=float), x.to(complex)

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(5)
    for r, e in zip(fast(x), f(x)):
        assert r.dtype == e.dtype and torch.equal(r, e)
    assert counts() == (1, 0, 0, 0)


def test_op_overloads_are_graph_operations():
    @torch.library.custom_op("tempa_test::twice", mutates_args={})
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    twice.register_fake(lambda x: torch.empty_like(x))

    def f(x):
        torch.ops.aten.add_.Tensor(x, 1)    # in place, result unused: kept in the graph
        return twice._opoverload(x) + twice(x)

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    x, y = torch.zeros(2), torch.zeros(2)
    assert torch.equal(fast(x), f(y)) and torch.equal(x, y)
    assert tempa.stats().graph_breaks == 0
    assert counts() == (1, 0, 0, 0)


def test_grad_mode_context_as_a_decorator_inside_the_compiled_code():
    def f(x):
        @torch.no_grad()
        def augment(x):
            return (x + 1) * 2
        return augment(x), x * 3, torch.is_grad_enabled()

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3, requires_grad=True)
    (a, b, grad), (ea, eb, egrad) = fast(x), f(x)
    assert torch.equal(a, ea) and not a.requires_grad and b.requires_grad and grad is egrad is True
    assert counts() == (1, 0, 0, 0)


# -- functions handed in: guarded by code and cells, not identity ------------------------

def _adder(v):
    def add(x):
        return x + v
    return add


def test_closures_are_guarded_by_code_and_cell_contents():
    def f(x, other):
        return other(x + 1) - 1

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(8)
    for g in (_adder(5), _adder(5), _adder(torch.randn(8)), _adder(torch.randn(8)), _adder(7)):
        assert torch.equal(fast(x, g), f(x, g))
    # 5, a tensor (an input of the graph, any value of its shape), 7: three captures
    assert tempa.stats().captures == 3


def test_new_closure_over_a_new_tensor_on_every_call_does_not_recompile():
    def use(g, y):
        return g(y) + 1

    fast = tempa.compile(use, backend="eager")
    for i in range(3):
        g = _adder(torch.full((2,), float(i)))   # a new function and cell on every call
        assert torch.equal(fast(g, 3), use(g, 3))
    s = tempa.stats()
    assert (s.captures, s.recompiles, s.eager_fallbacks) == (1, 0, 0)


def test_function_argument_defaults_and_identity():
    def f(fn, x):
        return fn, fn(x)

    def scale(x, s=2):
        return x * s

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    same, r = fast(scale, x)
    assert same is scale and torch.equal(r, x * 2)
    scale.__defaults__ = (3,)            # the default read is guarded at its source
    assert torch.equal(fast(scale, x)[1], x * 3)
    assert counts() == (2, 0, 1, 0)


def test_tensor_class_attribute_is_its_type():
    def f(x):
        tmp = f"{x.__class__.__name__} foo"
        if tmp.startswith("Tensor"):
            return x + 1
        return x - 1

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    assert torch.equal(fast(torch.ones(2)), torch.full((2,), 2.0))
    assert tempa.stats().captures == 1    # it ran eagerly: x.__class__ was a tensor method


# -- modules built inside a forward, in a process where torch.compile ran ------------------

@pytest.fixture
def dynamo_tags_new_modules():
    """nn.Module.__init__/__setstate__ as torch.compile's first call leaves them for the rest
    of the process (Dynamo's generation tagging), restored afterwards."""
    from torch._dynamo import mutation_guard
    module = torch.nn.Module
    saved = {k: module.__dict__[k] for k in ("__init__", "__setstate__")}
    flag = module.__dict__.get("___needs_generation_tag_patch")
    mutation_guard.install_generation_tagging_init()
    assert module.__init__.__name__ == "patched_init"      # the state this test is about
    yield
    for k, v in saved.items():
        setattr(module, k, v)
    if flag is None:
        delattr(module, "___needs_generation_tag_patch")
    else:
        setattr(module, "___needs_generation_tag_patch", flag)


class _Head(torch.nn.Module):
    """HF DistilBERT's classifier head: a module built inside the forward, called at once."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.ReLU()(self.proj(x)) * 2


def test_module_built_in_a_forward_after_torch_compile_patched_init(dynamo_tags_new_modules):
    # Dynamo's patched __init__ tags the new module in its own weak dictionary: tracing that
    # was a break (weakref.ref) at every module built inside a forward, fullgraph refused
    head = _Head()
    compiled = tempa.compile(head, fullgraph=True)
    for x in (torch.randn(3, 4), torch.randn(3, 4)):
        torch.testing.assert_close(compiled(x), head(x))
    assert counts() == (1, 0, 0, 0), tempa.stats()

