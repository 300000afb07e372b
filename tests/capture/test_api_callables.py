"""tempa.compile takes any callable, and the compiled-module wrapper behaves like its module
(issue 16, item 8). Each case checks eager's values and the path: torch.compile (torch
2.13, CompileCounter) captures every one of these callables in 1 frame with 0 breaks."""
import copy
import functools
import pickle

import pytest
import torch
import torch.nn as nn

import tempa
from tests.capture.paths import counts


def _one_graph():
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.eager_fallbacks) == (1, 0, 0), s


@functools.lru_cache
def _cached_sin(a):
    return a.sin()


class _Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, a):
        return a.cos() * self.k


def _scaled(k, a):
    return a * k


@pytest.mark.parametrize("make, nargs", [
    (lambda: torch.sin, 1),                                   # builtin
    (lambda: torch.ops.aten.add.Tensor, 2),                   # op overload
    (lambda: functools.partial(torch.add, alpha=2), 2),       # partial of a builtin
    (lambda: functools.partial(_scaled, 3.0), 1),             # partial of a Python function
    pytest.param(lambda: _cached_sin, 1, marks=pytest.mark.filterwarnings("ignore:tempa")),
    (lambda: _Scaler(2.0), 1),                                # object with __call__
    (lambda: _Scaler(2.0).__call__, 1),                       # bound method
], ids=["builtin", "opoverload", "partial-builtin", "partial-python", "lru_cache",
        "callable-object", "bound-method"])
def test_any_callable_compiles_into_one_graph(make, nargs):
    fn = make()
    args = [torch.randn(3, 4) for _ in range(nargs)]
    fast = tempa.compile(fn, fullgraph=True)
    torch.testing.assert_close(fast(*args), fn(*args))
    torch.testing.assert_close(fast(*args), fn(*args))
    _one_graph()


def test_an_op_overload_that_writes_into_its_argument_keeps_the_write():
    def f(a, b):
        c = a.clone()
        torch.ops.aten.add_.Tensor(c, b)      # result unused: must not be dead code
        return c
    a, b = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(tempa.compile(f, fullgraph=True)(a, b), a + b)
    _one_graph()


def test_a_function_whose_first_parameter_is_self():
    # a training-step style function: the graph's own `self` must not swallow the argument
    def step(self, x):
        return self * 2 + x
    t, x = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(tempa.compile(step, fullgraph=True)(t, x), t * 2 + x)
    _one_graph()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.fc(x))


def test_wrapper_mode_is_the_modules():
    model = _Net().eval()
    fast = tempa.compile(model)
    assert fast.training is False                 # torch.compile: False too
    model.train()
    assert fast.training is True
    fast.eval()
    assert model.training is False and model.bn.training is False
    x = torch.randn(5, 4)
    torch.testing.assert_close(fast(x), model(x))
    assert counts() == (1, 0, 0, 0)


@pytest.mark.passes_without_capture("the wrapper's own behaviour; nothing is called")
def test_attribute_writes_reach_the_module():
    model = _Net()
    fast = tempa.compile(model)
    fast.scale = 3
    assert model.scale == 3 and fast.scale == 3
    new_fc = nn.Linear(4, 3)
    fast.fc = new_fc
    assert model.fc is new_fc
    del fast.scale
    assert not hasattr(model, "scale")


@pytest.mark.passes_without_capture("the wrapper's own behaviour; nothing is called")
def test_state_dict_keys_are_the_modules_and_eager_checkpoints_load():
    model, other = _Net(), _Net()
    fast = tempa.compile(model)
    assert list(fast.state_dict()) == list(model.state_dict())
    fast.load_state_dict(other.state_dict())                   # saved from eager
    torch.testing.assert_close(model.fc.weight, other.fc.weight)
    prefixed = {"_orig_mod." + k: v * 2 for k, v in other.state_dict().items()}
    fast.load_state_dict(prefixed)                             # saved from torch.compile
    torch.testing.assert_close(model.fc.weight, other.fc.weight * 2)
    eager_again = _Net()
    eager_again.load_state_dict(fast.state_dict())             # and back into eager
    torch.testing.assert_close(eager_again.fc.weight, model.fc.weight)
    # nested inside another module, the keys have no wrapper in them either
    outer = nn.Sequential(tempa.compile(_Net()))
    assert list(outer.state_dict()) == list(nn.Sequential(_Net()).state_dict())
    outer.load_state_dict(nn.Sequential(other).state_dict())
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fast.load_state_dict({**other.state_dict(), "nonsense": torch.zeros(1)})


def test_a_class_overriding_call_runs_its_override_compiled():
    class Doubling(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

        def __call__(self, x):
            return super().__call__(x) * 2

    model = Doubling()
    x = torch.randn(2, 4)
    fast = tempa.compile(model, fullgraph=True)
    torch.testing.assert_close(fast(x), model(x))
    _one_graph()


def test_copies_and_pickles_keep_mode_and_keys():
    model = _Net().eval()
    fast = tempa.compile(model)
    x = torch.randn(5, 4)
    fast(x)
    for twin in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
        assert twin.training is False
        assert list(twin.state_dict()) == list(model.state_dict())
        torch.testing.assert_close(twin(x), model(x))
    assert counts() == (3, 0, 0, 0)


def test_lazy_module():
    model = nn.Sequential(nn.LazyLinear(3), nn.ReLU())
    fast = tempa.compile(model)
    x = torch.randn(2, 5)
    out = fast(x)
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(fast(x), out)
    assert tempa.stats().captures == 1


def test_lru_cache_bypass_is_said():
    # eager would return the cached result for the same tensor object; the compiled code
    # runs the body (as torch.compile does), and says so
    x = torch.randn(3)
    _cached_sin.cache_clear()
    with pytest.warns(UserWarning, match="lru_cache") as record:
        torch.testing.assert_close(tempa.compile(_cached_sin)(x), x.sin())
    # torch.compile's wording is kept in the text, for warning filters written against it
    assert any("Dynamo detected a call to a `functools.lru_cache`-wrapped" in str(w.message)
               for w in record)
    assert _cached_sin.cache_info().currsize == 0    # the compiled call did not fill it
