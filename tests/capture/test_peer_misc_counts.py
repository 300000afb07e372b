"""What tempa captures for the shapes of code PyTorch's Dynamo tests count (test_misc): the
graphs handed to the backend and their op counts match torch.compile's on the same code
(counted once with torch.compile in a throwaway script), and every call returns what eager
returns. Also: under fullgraph=True, a call whose code raises raises eager's exception that
is a tempa.GraphBreakError too."""
import itertools
import os

import pytest
import torch

import tempa
from tests.models.compare import assert_same


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


class Recorder:
    """A backend with torch.compile's contract that keeps each graph it is handed."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    @property
    def op_count(self):
        return sum(1 for g in self.graphs for n in g.graph.nodes if n.op.startswith("call"))


# -- fullgraph=True and an exception of the user's code -----------------------------------

class Foo:
    def __init__(self, x):
        self.x = x


class TwoArgError(Exception):
    def __init__(self, a, b):   # args do not fit __init__: the copy must not call it
        super().__init__(f"{a} and {b}")
        self.a = a


def subtract(a, b):
    return a - b


def frozenset_add():
    s = frozenset((1, 2, 3))
    s.add(4)
    return len(s)


def permutations_bad_kwarg(*args, **kwargs):
    return torch.tensor(list(itertools.permutations(*args, **kwargs)))


def raises_own(x):
    raise TwoArgError(1, x.shape[0])


CASES = [(subtract, (Foo(1), Foo(2)), TypeError),
         (frozenset_add, (), AttributeError),
         (permutations_bad_kwarg, ([1, 2, 3],), None),   # fine: no error
         (lambda: permutations_bad_kwarg([1, 2, 3], fake_arg=1), (), TypeError),
         (raises_own, (torch.ones(3),), TwoArgError)]


def eager_error(fn, args):
    try:
        fn(*args)
    except Exception as e:
        return e
    return None


@pytest.mark.parametrize("fn,args,cls", CASES)
def test_fullgraph_user_exception_is_eagers_and_a_graph_break(fn, args, cls):
    fast = tempa.compile(fn, backend="eager", fullgraph=True)
    if cls is None:
        assert_same(fast(*args), fn(*args))
        assert tempa.stats().captures == 1
        return
    expected = eager_error(fn, args)
    with pytest.raises(tempa.GraphBreakError) as info:
        fast(*args)
    err = info.value
    assert isinstance(err, cls) and isinstance(err, tempa.GraphBreakError)
    assert str(err) == str(expected) and err.args == expected.args
    assert type(err.__cause__) is type(expected) and str(err.__cause__) == str(expected)
    assert err.reason.type == "user exception"
    assert any("fullgraph=True" in note for note in err.__notes__)
    assert tempa.stats().captures == 0 and tempa.stats().graph_breaks == 1


def test_fullgraph_user_exception_keeps_the_fields_of_eagers():
    fast = tempa.compile(frozenset_add, backend="eager", fullgraph=True)
    with pytest.raises(AttributeError) as info:   # `except AttributeError` still catches it
        fast()
    assert isinstance(info.value, tempa.GraphBreakError)
    assert info.value.name == "add" and info.value.obj == frozenset((1, 2, 3))
    with pytest.raises(TwoArgError) as info:
        tempa.compile(raises_own, backend="eager", fullgraph=True)(torch.ones(3))
    assert info.value.a == 1


@pytest.mark.passes_without_capture("eager's own exception, unchanged, is the expected result")
@pytest.mark.parametrize("fn,args,cls", [c for c in CASES if c[2] is not None])
def test_without_fullgraph_eagers_exception_passes_unchanged(fn, args, cls):
    expected = eager_error(fn, args)
    with pytest.raises(cls) as info:
        tempa.compile(fn, backend="eager")(*args)
    assert type(info.value) is type(expected) and not isinstance(info.value, tempa.GraphBreakError)
    assert str(info.value) == str(expected) and info.value.__cause__ is None
    assert tempa.stats().graph_breaks == 0


# -- iterating a tensor: one getitem a row, as torch.compile --------------------------------

def add_to_rows(x):
    for y in x:
        y.add_(1.0)
    return y


def test_tensor_iteration_is_one_op_a_row_and_mutates_eagers_rows():
    rec = Recorder()
    x = torch.randn(10, 4)
    expected_x = x.clone()
    expected = add_to_rows(expected_x)
    out = tempa.compile(add_to_rows, backend=rec)(x)
    assert_same(out, expected)
    assert_same(x, expected_x)
    assert out._base is x and out.data_ptr() == x[9].data_ptr()   # the last row, a view of x
    assert (len(rec.graphs), rec.op_count) == (1, 20)   # torch.compile: 10 getitem + 10 add_
    assert tempa.stats().captures == 1 and tempa.stats().graph_breaks == 0


def test_star_unpacking_a_tensor_is_its_rows():
    rec = Recorder()
    fn = lambda x: torch.cat([*x], dim=-1)   # noqa: E731
    x = torch.randn(1, 1, 5, 6)
    assert_same(tempa.compile(fn, backend=rec)(x), fn(x))
    assert (len(rec.graphs), rec.op_count) == (1, 2)   # getitem + cat, as torch.compile


def test_iterating_a_tensor_that_requires_grad_keeps_eagers_error():
    """Eager's rows are unbind's multi-output views: an in-place op on one raises when the
    tensor requires grad (a select view would not), so that case keeps unbind."""
    def fn(a):
        return add_to_rows(a * 2)
    a = torch.randn(3, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="multiple views"):
        fn(a)
    with pytest.raises(RuntimeError, match="multiple views"):
        tempa.compile(fn, backend="eager")(a)
    assert tempa.stats().captures == 1   # the graph raised it, as eager


# -- torch dispatch modes --------------------------------------------------------------------

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class AddIsMul(TorchDispatchMode):
    """Sees every op (ignore_compile_internals() is False) and changes add into mul."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.add.Tensor:
            func = torch.ops.aten.mul.Tensor
        return func(*args, **(kwargs or {}))


class CountsOps(TorchDispatchMode):
    """Compiled code is opaque to it by its own declaration."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))

    @classmethod
    def ignore_compile_internals(cls):
        return True


def add_sin(x):
    return (x + x).sin()


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_a_mode_that_sees_every_op_gets_eagers_answer(backend):
    x = torch.full((3,), 3.0)
    with AddIsMul():
        expected = add_sin(x)
    fast = tempa.compile(add_sin, backend=backend)
    for first_without_mode in (False, True):
        if first_without_mode:
            assert_same(fast(x), add_sin(x))   # compiled, without the mode
        with AddIsMul():
            assert_same(fast(x), expected)   # eagerly: the mode turns add into mul
    assert tempa.stats().eager_fallbacks == 1   # said once
    assert tempa.stats().captures == 1          # only the call without the mode captured


def test_a_mode_that_ignores_compile_internals_gets_a_graph_and_no_capture_ops():
    rec = Recorder()
    x = torch.randn(4)
    mode = CountsOps()
    with mode:
        out = tempa.compile(add_sin, backend=rec, fullgraph=True)(x)
    assert_same(out, add_sin(x))
    assert len(rec.graphs) == 1 and tempa.stats().captures == 1
    # capture's fake-tensor ops did not reach it; the eager-run graph's two ops did
    assert mode.ops == 2


# -- a random draw nothing reads still moves the generator -----------------------------------

def unused_draws(x):
    torch.randn(3)
    torch.nn.functional.dropout(x, 0.5, training=True)
    x.bernoulli()
    torch.rand(2, generator=None)
    return x + torch.rand(2)


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_unused_random_draws_advance_the_generator_as_in_eager(backend):
    x = torch.full((2,), 0.5)
    torch.manual_seed(0)
    expected, expected_next = unused_draws(x), torch.rand(2)
    fast = tempa.compile(unused_draws, backend=backend)
    for _ in range(2):
        torch.manual_seed(0)
        out, next_draw = fast(x), torch.rand(2)
        assert_same(out, expected)
        assert_same(next_draw, expected_next)   # the generator is where eager left it
    assert tempa.stats().captures == 1 and tempa.stats().graph_breaks == 0


# -- torch._C._dynamo's functions are not tensor operations ----------------------------------

def test_dynamos_c_helpers_are_a_graph_break_not_an_op():
    from torch._dynamo.testing import unsupported   # a C builtin of torch._C._dynamo
    rec = Recorder()

    def fn(a, b):
        c = unsupported(a, b)
        return a + b * 10 + c
    v = torch.Tensor([100])
    assert_same(tempa.compile(fn, backend=rec)(v, v), fn(v, v))
    # torch.compile: 3 ops (it breaks the graph at unsupported, which runs in Python)
    assert rec.op_count == 3 and tempa.stats().graph_breaks == 1
    assert all(n.target is not unsupported for g in rec.graphs for n in g.graph.nodes)


# -- a break at `container[key] = value`: the store runs, the rest stays compiled -----------

def set_environ_between(x):
    x = x + 1
    os.environ["TEMPA_PEER_MISC_TEST"] = str(x.shape[0])
    return torch.sin(x)


def test_a_store_that_breaks_runs_and_the_rest_is_compiled(monkeypatch):
    monkeypatch.setenv("TEMPA_PEER_MISC_TEST", "unset")
    rec = Recorder()
    fast = tempa.compile(set_environ_between, backend=rec)
    for n in (3, 3, 5):
        os.environ["TEMPA_PEER_MISC_TEST"] = "unset"
        x = torch.ones(n)
        assert_same(fast(x), torch.sin(x + 1))
        assert os.environ["TEMPA_PEER_MISC_TEST"] == str(n)   # the store ran, every call
    # torch.compile: 2 graphs (x + 1, then sin after the break), per shape
    assert [g.code.count("torch.sin") for g in rec.graphs[:2]] == [0, 1]
    assert tempa.stats().graph_breaks >= 1 and tempa.stats().eager_fallbacks == 0


def test_a_store_that_breaks_keeps_the_identity_of_a_made_container():
    def fn(x):
        d = {}
        box = [d]
        os.environ["TEMPA_PEER_MISC_TEST2"] = "1"   # the break
        d["y"] = x * 2
        return box, d
    fast = tempa.compile(fn, backend="eager")
    box, d = fast(torch.ones(2))
    assert box[0] is d and torch.equal(d["y"], torch.full((2,), 2.0))
    assert tempa.stats().graph_breaks == 1 and tempa.stats().captures == 2
    os.environ.pop("TEMPA_PEER_MISC_TEST2", None)


# -- the text of a symbolic size is its value ------------------------------------------------

TEXT_OF_SIZES = [lambda x: str(x.shape[0]), lambda x: f"{x.shape[0]}", lambda x: f"{x.shape[0]:>4}",
                 lambda x: repr(x.shape[0]), lambda x: format(x.shape[0], "d"),
                 lambda x: "{}-{}".format(x.shape[0], 7), lambda x: "%s" % (x.shape[0],),
                 lambda x: str(x.shape), lambda x: repr(x.size())]


@pytest.mark.parametrize("fn", TEXT_OF_SIZES)
def test_text_of_a_dynamic_size_is_its_value_not_its_symbol(fn):
    fast = tempa.compile(fn, backend="eager")
    for n in (3, 4, 5, 4):   # 4 and 5 come after a size change: symbolic sizes
        assert fast(torch.ones(n)) == fn(torch.ones(n))
    assert tempa.stats().captures == 3 and tempa.stats().eager_fallbacks == 0   # one a size


def test_arithmetic_on_a_dynamic_size_stays_symbolic():
    fn = lambda x: x.view(-1) * (x.shape[0] * 2)   # noqa: E731
    fast = tempa.compile(fn, backend="eager")
    for n in (3, 4, 5, 6):
        assert_same(fast(torch.ones(n)), fn(torch.ones(n)))
    assert tempa.stats().captures == 2   # static, then one symbolic graph for every size


def test_rows_written_with_an_operand_that_requires_grad_keep_eagers_error():
    """``y.add_(w)`` with ``w`` requiring grad makes a row of unbind's multi-output views
    require grad in place, which eager refuses; the graph goes back to unbind for it."""
    rec = Recorder()

    def fn(x, w):
        for y in x:
            y.add_(w)
        return y
    x, w = torch.randn(3, 2), torch.randn(2, requires_grad=True)
    with pytest.raises(RuntimeError) as expected:
        fn(x.clone(), w)
    with pytest.raises(RuntimeError) as got:
        tempa.compile(fn, backend=rec)(x.clone(), w)
    assert str(got.value) == str(expected.value)
    assert "unbind" in rec.graphs[0].code
    # without grad the rows stay x[i] (torch.compile's graph) and the values are eager's
    tempa.reset()
    rec = Recorder()
    w = w.detach()
    a, b = x.clone(), x.clone()
    assert_same(tempa.compile(fn, backend=rec)(a, w), fn(b, w))
    assert_same(a, b)
    assert "unbind" not in rec.graphs[0].code and rec.op_count == 6
