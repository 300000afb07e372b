"""A class's own Python ``__getattribute__`` (an HF config's key aliasing) runs traced at
capture: the guards read what it read, the instance dict and the class through
``object.__getattribute__`` and the tables it looked keys up in, and those guards are
skipped while the version tags of the object's instance dict, its class and those tables
are unchanged (capture/cache.py ``_source_guard_roots``, nativeguards kind ``g``). Each
test changes one such thing after the fast path is in use; the next call must see it as
eager does."""
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


class Spec:
    """The mixin's hook, as HF's HeterogeneousConfigMixin: reads its own instance dict."""

    def __getattribute__(self, key):
        if super().__getattribute__("__dict__").get("_per_layer") is not None:
            raise AttributeError(key)
        return super().__getattribute__(key)


class Config(Spec):
    """Key aliasing through a class-level table, as HF's PretrainedConfig."""
    attribute_map = {"width": "hidden"}

    def __init__(self):
        self.hidden = 2.0
        self.table = {"shift": 1.0}
        self.flag = True


class Net(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        c = self.config
        y = self.lin(x) * c.width + c.table["shift"]
        extra = getattr(c, "extra", None)
        if extra is not None:
            y = y + extra
        return y if c.flag else -y


def _hooked(cls):
    def __getattribute__(self, key):
        if key != "attribute_map" and key in super(cls, self).__getattribute__("attribute_map"):
            key = super(cls, self).__getattribute__("attribute_map")[key]
        return super(cls, self).__getattribute__(key)
    cls.__getattribute__ = __getattribute__
    return cls


@pytest.fixture
def model_and_input():
    torch.manual_seed(0)
    config = _hooked(type("Config", (Config,), {"attribute_map": {"width": "hidden"}}))()
    return Net(config).eval(), torch.randn(3, 4)


def _entry(fast):
    call = fast.__dict__["_tempa_call"]
    (e,) = getattr(call, "func", call).__tempa_cache__.entries
    return e


def _steady_lines(e) -> list:
    """The entry's checks that run on every call (outside the versioned groups)."""
    lines = e.source.split("    except Exception:")[0].splitlines()
    return [line for line in lines if line.startswith("        if not (")]


def _versions_unchanged(e) -> bool:
    call = re.search(r"___ch = (.*)", e.source).group(1)
    return eval(call, e.fn.__globals__) == 0          # noqa: S307 - the entry's own text


def _on_fast_path(model, x):
    fast = tempa.compile(model)
    with torch.no_grad():
        fast(x)
        fast(x)
    e = _entry(fast)
    assert _versions_unchanged(e)
    assert counts()[0] == 1
    return fast, e


def _seen(fast, model, x, captures=2):
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    assert counts()[0] == captures


def test_the_config_reads_are_versioned_not_run_per_call(model_and_input):
    m, x = model_and_input
    fast, e = _on_fast_path(m, x)
    config = e.fn.__globals__
    hook_reads = [line for line in _steady_lines(e)
                  if any(config.get(name) is m.config for name in re.findall(r"___O\d+", line))]
    assert hook_reads == []       # no guard runs the config's hooks on every call
    assert "'hidden'" in e.source and "'extra'" in e.source   # read past the hooks


def test_a_changed_config_value_is_seen(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    m.config.hidden = 5.0
    _seen(fast, m, x)


def test_a_missing_attribute_that_appears_is_seen(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    m.config.extra = 100.0
    _seen(fast, m, x)


class Aliasing:
    """Only the aliasing hook (no mixin reading the instance dict as a whole): a missing
    attribute is guarded by its own absence."""
    attribute_map = {"width": "hidden"}

    def __init__(self):
        self.hidden = 2.0
        self.table = {"shift": 1.0}
        self.flag = True


def test_a_missing_attribute_that_appears_is_seen_by_its_absence_guard():
    torch.manual_seed(0)
    m, x = Net(_hooked(Aliasing)()).eval(), torch.randn(3, 4)
    fast, e = _on_fast_path(m, x)
    assert "'extra')" in e.source
    m.config.extra = 100.0
    _seen(fast, m, x)


def test_a_write_to_a_dict_inside_the_config_is_seen(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    m.config.table["shift"] = -3.0
    _seen(fast, m, x)


def test_a_write_to_the_class_alias_table_is_seen(model_and_input):
    m, x = model_and_input
    m.config.other = 7.0
    fast, _ = _on_fast_path(m, x)
    type(m.config).attribute_map["width"] = "other"     # the table alone changes
    _seen(fast, m, x)


def test_a_new_instance_dict_is_seen(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    object.__setattr__(m.config, "__dict__", {"hidden": 2.0, "table": {"shift": 9.0}, "flag": True})
    _seen(fast, m, x)


def test_a_per_layer_spec_seen_by_the_mixin_hook(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    m.config._per_layer = {"hidden": 3}      # the mixin's hook now raises for every key
    with pytest.raises(AttributeError):
        m(x)
    with pytest.raises(AttributeError), torch.no_grad():
        fast(x)


def test_a_patched_hook_is_seen(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    cls = type(m.config)

    def doubled(self, key):
        value = Config.__getattribute__(self, "hidden" if key == "width" else key)
        return value * 2 if key == "width" else value
    cls.__getattribute__ = doubled
    _seen(fast, m, x)


def test_a_class_swap_is_seen(model_and_input):
    m, x = model_and_input
    fast, _ = _on_fast_path(m, x)
    m.config.__class__ = _hooked(type("Other", (Config,), {"attribute_map": {"width": "flag"}}))
    _seen(fast, m, x)


class Counting:
    """A hook the interpreter does not trace (it assigns a class attribute): read as before,
    by running it, and what its abandoned trace read leaves no guard behind (the hook's
    own run changes it: such a guard failed on its own capture and the int became a
    symbol recompiled on every call)."""
    reads = 0

    def __init__(self):
        self.scale = 3.0

    def __getattribute__(self, key):
        type(self).reads = type(self).reads + 1
        return super().__getattribute__(key)


def test_an_untraced_hook_leaves_no_guards_of_its_trace():
    counter = Counting()

    def f(x):
        return x * counter.scale
    x = torch.randn(3)
    fast = tempa.compile(f)
    for _ in range(4):
        torch.testing.assert_close(fast(x), x * 3.0)
    assert counts()[:3] == (1, 0, 0)          # one capture, no break, no recompile


LOG = []


class Logging:
    """A hook the interpreter traces, which writes outside state on every read."""

    def __init__(self):
        self.scale = 3.0

    def __getattribute__(self, key):
        LOG.append(key)
        return super().__getattribute__(key)


def test_a_traced_hook_that_writes_breaks_the_graph():
    obj = Logging()

    def f(x):
        return x.sin() * obj.scale
    x = torch.randn(3)
    fast = tempa.compile(f)
    fast(x)
    for _ in range(3):
        before = len(LOG)
        torch.testing.assert_close(fast(x), x.sin() * 3.0)
        assert LOG[before:] == ["scale"]           # one read a call, as eager's
    assert counts()[1] >= 1                        # said as a graph break


def test_fast_guards_off_gives_the_same_answers(model_and_input, monkeypatch):
    monkeypatch.setattr(tempa.config, "fast_guards", False)
    m, x = model_and_input
    fast = tempa.compile(m)
    with torch.no_grad():
        fast(x)
        m.config.hidden = 4.0
        torch.testing.assert_close(fast(x), m(x))
    call = fast.__dict__["_tempa_call"]
    assert all("___ch" not in e.source for e in call.func.__tempa_cache__.entries)
    assert counts()[0] == 2
