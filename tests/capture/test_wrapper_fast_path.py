"""OptimizedModule.__call__ tests its seven hook tables (the wrapper's forward hooks and
pre-hooks, its hooked submodules, the module's forward and backward hooks) in one native
call (nativeguards ``hooks_clear``) and calls the compiled forward when all are empty. Each
test brings a compiled module to that fast path, adds a hook, and the next call must run it
as eager does."""
import itertools
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

import tempa
import tempa.optimized_module as optimized_module
from tempa.backend.runtime import nativeguards

from tests.capture.paths import counts


@pytest.fixture
def native_hooks_clear(monkeypatch):
    hooks_clear = nativeguards.hooks_clear()    # (waits for the extension's build)
    if hooks_clear is None:
        pytest.skip("the native guard extension cannot be built here")
    # the wrapper's choice as in a fresh process: whatever tests ran before in this one
    # (one with fast guards off, say) must not decide it
    monkeypatch.setattr(optimized_module, "_hooks_clear", optimized_module._hooks_clear_until_native)
    return hooks_clear


def _on_fast_path(model, x):
    """Compile ``model`` and call it until the wrapper's test is the native one."""
    fast = tempa.compile(model)
    fast(x)
    fast(x)
    assert optimized_module._hooks_clear is nativeguards.hooks_clear()
    assert counts()[0] == 1
    return fast


def test_a_wrapper_pre_hook_added_on_the_fast_path_runs(native_hooks_clear):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 3), torch.randn(2, 4)
    with torch.no_grad():
        fast = _on_fast_path(model, x)
        fast.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
        torch.testing.assert_close(fast(x), model(x * 2))


def test_a_wrapper_forward_hook_added_on_the_fast_path_runs(native_hooks_clear):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 3), torch.randn(2, 4)
    with torch.no_grad():
        fast = _on_fast_path(model, x)
        fast.register_forward_hook(lambda mod, args, out: out + 100)
        torch.testing.assert_close(fast(x), model(x) + 100)


def test_a_module_hook_added_on_the_fast_path_runs(native_hooks_clear):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 3), torch.randn(2, 4)
    with torch.no_grad():
        fast = _on_fast_path(model, x)
        handle = model.register_forward_hook(lambda mod, args, out: out - 7)
        expected = model(x)
        torch.testing.assert_close(fast(x), expected)
        handle.remove()
        torch.testing.assert_close(fast(x), model(x))


def test_a_module_given_a_new_instance_dict_is_read_at_the_call(native_hooks_clear):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 3), torch.randn(2, 4)
    with torch.no_grad():
        fast = _on_fast_path(model, x)
        model.register_forward_hook(lambda mod, args, out: out * 0 + 1)
        model.__dict__ = dict(model.__dict__)        # (the same entries, a new dict)
        torch.testing.assert_close(fast(x), torch.ones(2, 3))


def test_a_module_backward_hook_added_on_the_fast_path_runs(native_hooks_clear):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 3), torch.randn(2, 4, requires_grad=True)
    fast = _on_fast_path(model, x)
    seen = []
    model.register_full_backward_hook(lambda mod, gin, gout: seen.append(gout[0].shape))
    fast(x).sum().backward()
    assert seen == [(2, 3)]


@pytest.mark.passes_without_capture("compares the native test with its Python definition")
def test_native_hooks_clear_answers_as_the_python_test(native_hooks_clear):
    wrapper_keys = ("_forward_hooks", "_forward_pre_hooks", "_tempa_hooked")
    module_keys = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    full = OrderedDict(a=1)
    for bits in itertools.product((0, 1), repeat=len(wrapper_keys) + len(module_keys)):
        d = {k: (([1] if k == "_tempa_hooked" else full) if b else
                 ([] if k == "_tempa_hooked" else OrderedDict()))
             for k, b in zip(wrapper_keys, bits)}
        mod = nn.Module()
        mod.__dict__.update({k: full if b else OrderedDict()
                             for k, b in zip(module_keys, bits[len(wrapper_keys):])})
        assert native_hooks_clear(d, mod) is optimized_module._hooks_clear_python(d, mod)
    with pytest.raises(KeyError):
        native_hooks_clear({}, nn.Module())
