"""What tempa captures for the shapes of code PyTorch's Dynamo tests count (test_misc): the
graphs handed to the backend and their op counts match torch.compile's on the same code
(counted once with torch.compile in a throwaway script), and every call returns what eager
returns. Also: under fullgraph=True, a call whose code raises raises eager's exception that
is a tempa.GraphBreakError too."""
import itertools

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
    assert info.value.name == "add" and info.value.obj == frozenset((1, 2, 3))
    with pytest.raises(TwoArgError) as info:
        tempa.compile(raises_own, backend="eager", fullgraph=True)(torch.ones(3))
    assert info.value.a == 1


@pytest.mark.parametrize("fn,args,cls", [c for c in CASES if c[2] is not None])
def test_without_fullgraph_eagers_exception_passes_unchanged(fn, args, cls):
    expected = eager_error(fn, args)
    with pytest.raises(cls) as info:
        tempa.compile(fn, backend="eager")(*args)
    assert type(info.value) is type(expected) and not isinstance(info.value, tempa.GraphBreakError)
    assert str(info.value) == str(expected) and info.value.__cause__ is None
    assert tempa.stats().graph_breaks == 0
