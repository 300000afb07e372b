"""Guards that only dicts' and classes' contents decide (module globals, a module's
instance dict and ``_modules`` entries, class methods, hook dicts) are skipped while the
version tags of those dicts and classes are what they were when the guards last held
(capture/cache.py ``_versioned_groups``, nativeguards ``versions_changed``). Each test
changes one such thing after the fast path is in use, and the next call must see it as
eager does, through a new capture."""
import re
import sys

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.runtime import nativeguards

from tests.capture.paths import counts

pytestmark = pytest.mark.skipif(not (0x030B0000 <= sys.hexversion < 0x030E0000),
                                reason="version tags are read on CPython 3.11-3.13")


@pytest.fixture(autouse=True)
def _native_available():
    if nativeguards.versions_changed() is None:
        pytest.skip("the native guard extension cannot be built here")


def scale(x):
    return x * 2


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alpha = 0.5

    def helper(self, x):
        return x + 1

    def forward(self, x):
        return self.helper(self.lin(x)) * self.alpha


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.act = nn.ReLU()

    def forward(self, x):
        return scale(self.act(self.inner(x)))


def _entry(fast):
    """The compiled module's one cache entry (capture/cache.py Entry)."""
    call = fast.__dict__["_tempa_call"]
    (e,) = getattr(call, "func", call).__tempa_cache__.entries
    return e


def _versions_unchanged(e) -> bool:
    call = re.search(r"___ch = (.*)", e.source).group(1)
    return eval(call, e.fn.__globals__) == 0          # noqa: S307 - the entry's own text


def _fast_path_in_use(fast, x):
    """Two calls; after them the entry's version check finds nothing changed."""
    fast(x)
    fast(x)
    e = _entry(fast)
    assert _versions_unchanged(e)
    return e


def _seen_after_fast_path(model, x, change, captures=2):
    """Compile ``model``, bring its entry to the fast path, ``change`` something, and check
    that the next call gives eager's answer through ``captures`` captures in all."""
    fast = tempa.compile(model)
    with torch.no_grad():
        _fast_path_in_use(fast, x)
    change()
    _check(fast, model, x, captures)


def _check(fast, model, x, captures):
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    assert counts()[0] == captures


@pytest.fixture
def model_and_input():
    torch.manual_seed(0)
    return Outer().eval(), torch.randn(3, 4)


def test_the_entry_groups_dict_class_and_hook_guards(model_and_input):
    m, x = model_and_input
    fast = tempa.compile(m)
    with torch.no_grad():
        e = _fast_path_in_use(fast, x)
    assert "if ___ch:" in e.source and "if ___ch & " in e.source
    body = e.source.split("if ___ch:")[1]
    assert "['_modules']['inner']" in body         # a submodule entry
    assert "'forward' not in" in body              # no instance forward
    assert counts()[0] == 1


def test_a_rebound_global_function_is_seen(model_and_input):
    m, x = model_and_input
    fast = tempa.compile(m)
    global scale
    old = scale
    with torch.no_grad():
        _fast_path_in_use(fast, x)
    try:
        scale = lambda t: t * 3                      # noqa: E731
        _check(fast, m, x, 2)
    finally:
        scale = old


def test_a_patched_class_method_is_seen(model_and_input, monkeypatch):
    m, x = model_and_input
    _seen_after_fast_path(m, x, lambda: monkeypatch.setattr(Inner, "helper", lambda self, t: t - 5))


def test_a_changed_instance_attribute_is_seen(model_and_input):
    m, x = model_and_input
    _seen_after_fast_path(m, x, lambda: setattr(m.inner, "alpha", 2.0))


def test_a_submodule_replaced_in_modules_is_seen(model_and_input):
    m, x = model_and_input
    _seen_after_fast_path(m, x, lambda: m._modules.__setitem__("act", nn.Tanh()))


def test_an_instance_forward_override_is_seen(model_and_input):
    m, x = model_and_input
    fast = tempa.compile(m)
    with torch.no_grad():
        _fast_path_in_use(fast, x)
    m.act.forward = lambda t: t * 0 + 7
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x))
    assert counts()[0] >= 1


def test_a_hook_added_after_the_fast_path_runs(model_and_input):
    m, x = model_and_input
    fast = tempa.compile(m)
    with torch.no_grad():
        _fast_path_in_use(fast, x)
    seen = []
    m.inner.lin.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    with torch.no_grad():
        torch.testing.assert_close(fast(x), m(x))
    assert seen == [(3, 4), (3, 4)]                    # the compiled call's and eager's


def test_a_class_swap_is_seen(model_and_input):
    m, x = model_and_input

    class Doubled(Inner):
        def helper(self, t):
            return t * 100

    _seen_after_fast_path(m, x, lambda: setattr(m.inner, "__class__", Doubled))


def test_after_a_change_the_fast_path_comes_back(model_and_input):
    m, x = model_and_input
    fast = tempa.compile(m)
    with torch.no_grad():
        _fast_path_in_use(fast, x)
        m.inner.alpha = 2.0
        fast(x)                                          # recaptured
        assert counts()[0] == 2
        fast(x)
        fast(x)
        call = fast.__dict__["_tempa_call"]
        entries = getattr(call, "func", call).__tempa_cache__.entries
        assert any(_versions_unchanged(e) for e in entries if "___ch" in e.source)
        torch.testing.assert_close(fast(x), m(x))


def test_fast_guards_off_keeps_every_guard_flat(model_and_input, monkeypatch):
    monkeypatch.setattr(tempa.config, "fast_guards", False)
    m, x = model_and_input
    fast = tempa.compile(m)
    with torch.no_grad():
        fast(x)
    assert "___ch" not in _entry(fast).source
    assert counts()[0] == 1


def test_a_new_modules_dict_is_read_through_its_owner():
    # a Sequential's deletion puts a new ``_modules`` dict in place: a later change to that
    # new dict must be seen, though the dict bound at capture never changes again
    torch.manual_seed(0)
    seq = nn.Sequential(nn.ReLU(), nn.Tanh())
    x = torch.randn(3, 4)
    fast = tempa.compile(seq)
    with torch.no_grad():
        _fast_path_in_use(fast, x)
        seq.__dict__["_modules"] = dict(seq._modules)       # same entries, a new dict
        torch.testing.assert_close(fast(x), seq(x))
        fast(x)
        seq._modules["1"] = nn.Sigmoid()                     # a write to the new dict only
        torch.testing.assert_close(fast(x), seq(x))
    assert counts()[0] >= 2


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.sizes = [2, 3]              # a mutable value: its contents are no version's

    def forward(self, x):
        return x * len(self.sizes) + self.sizes[0]


def test_a_mutable_attribute_value_is_checked_every_call():
    h = Holder()
    x = torch.randn(3)
    fast = tempa.compile(h)
    fast(x)
    fast(x)
    h.sizes.append(4)                    # the instance dict is unchanged
    torch.testing.assert_close(fast(x), h(x))
    h.sizes[0] = 10
    torch.testing.assert_close(fast(x), h(x))
    assert counts()[0] >= 2


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.ReLU(), nn.Tanh()])

    def forward(self, x):
        for layer in self.layers:                # iterated: its children are guarded
            x = layer(x) + 1
        return x


def test_a_module_list_grown_after_the_fast_path_is_seen():
    s = Stack()
    x = torch.randn(3)
    fast = tempa.compile(s)
    _fast_path_in_use(fast, x)
    assert "['_modules'].items()) ==" in _entry(fast).source.split("if ___ch:")[1]
    s.layers.append(nn.Sigmoid())
    torch.testing.assert_close(fast(x), s(x))
    assert counts()[0] == 2


REGISTRY = {"scales": {"a": 2.0}, "order": ("a",)}


def registry_forward(x):
    # the library-registry pattern: a global dict of dicts read inside forward
    return x * REGISTRY["scales"][REGISTRY["order"][0]]


class RegistryUser(nn.Module):
    def forward(self, x):
        return registry_forward(x)


def test_a_nested_registry_write_after_the_fast_path_is_seen():
    m = RegistryUser()
    x = torch.randn(3)
    fast = tempa.compile(m)
    _fast_path_in_use(fast, x)
    try:
        REGISTRY["scales"]["a"] = 5.0          # the nested dict only
        torch.testing.assert_close(fast(x), m(x))
        assert counts()[0] == 2
    finally:
        REGISTRY["scales"]["a"] = 2.0


def test_a_patched_library_function_is_seen(monkeypatch):
    class UsesRelu(nn.Module):
        def forward(self, x):
            return torch.nn.functional.relu(x) + 1

    m = UsesRelu()
    x = torch.randn(3)
    fast = tempa.compile(m)
    _fast_path_in_use(fast, x)
    assert ".relu is " in _entry(fast).source.split("if ___ch:")[1]
    monkeypatch.setattr(torch.nn.functional, "relu", torch.tanh)
    torch.testing.assert_close(fast(x), m(x))
    assert counts()[0] == 2
