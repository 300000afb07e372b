"""The user-facing surface of issue 2: compile(), OptimizedModule, stats, reset, config."""
import threading
import warnings

import pytest
import torch
import torch.nn as nn

import tempa
from tests.capture.paths import counts
from tests.models import zoo
from tests.models.compare import assert_same


class JaringanKecil(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_seed_example_prints_optimized_module_and_true(capsys):
    torch.manual_seed(42)
    model = JaringanKecil()
    model_kompilasi = tempa.compile(model)
    print("Tipe hasil torch.compile :", type(model_kompilasi).__name__)
    x = torch.randn(8, 32)
    y_eager = model(x)
    y_kompilasi = model_kompilasi(x)
    print("Keluaran sama (atol 1e-5):", torch.allclose(y_eager, y_kompilasi, atol=1e-5))
    out = capsys.readouterr().out
    assert "Tipe hasil torch.compile : OptimizedModule" in out
    assert "Keluaran sama (atol 1e-5): True" in out
    assert tempa.stats().captures == 1


def test_nothing_happens_until_the_first_call():
    fast = tempa.compile(JaringanKecil(), backend="eager")
    assert tempa.stats().captures == 0
    fast(torch.randn(2, 32))
    assert tempa.stats().captures == 1


def test_optimized_module_shares_parameters_and_leaves_original_untouched():
    model = JaringanKecil()
    fast = tempa.compile(model, backend="eager")
    assert isinstance(fast, tempa.OptimizedModule) and isinstance(fast, nn.Module)
    assert fast._orig_mod is model
    assert fast.fc1 is model.fc1                       # attribute access delegates
    assert {id(p) for p in fast.parameters()} == {id(p) for p in model.parameters()}
    assert type(model).forward is JaringanKecil.forward and "forward" not in model.__dict__
    x = torch.randn(3, 32)
    assert_same(fast(x), model(x))
    with torch.no_grad():                              # in-place update seen by both
        model.fc2.bias.add_(1.0)
    assert_same(fast(x), model(x))
    assert counts() == (1, 0, 0, 0)


def test_function_and_decorator_forms():
    @tempa.compile
    def f(x, y):
        return torch.sin(x) + y * 2

    @tempa.compile(backend="eager", fullgraph=True)
    def g(x):
        return x.relu().sum(dim=-1)

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    assert_same(f(x, y), torch.sin(x) + y * 2)
    assert_same(g(x), x.relu().sum(dim=-1))
    assert f.__name__ == "f"
    assert counts() == (2, 0, 0, 0)


def test_custom_backend_receives_fx_graph_and_example_inputs():
    seen = []

    def my_backend(gm, example_inputs):
        seen.append((gm, [tuple(t.shape) for t in example_inputs]))
        return gm

    fast = tempa.compile(JaringanKecil(), backend=my_backend)
    fast(torch.randn(8, 32))
    assert len(seen) == 1
    gm, shapes = seen[0]
    assert isinstance(gm, torch.fx.GraphModule)
    assert shapes[0] == (8, 32)                         # the user's input first
    assert (64, 32) in shapes                           # then parameters


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_bad_arguments_raise_like_eager():
    fast = tempa.compile(JaringanKecil(), backend="eager")
    with pytest.raises(RuntimeError) as compiled_err:
        fast(torch.randn(8, 31))
    with pytest.raises(RuntimeError) as eager_err:
        JaringanKecil()(torch.randn(8, 31))
    assert str(compiled_err.value) == str(eager_err.value)
    with pytest.raises(TypeError):
        fast(torch.randn(8, 32), torch.randn(1))
    with pytest.raises(ValueError, match="unknown backend"):
        tempa.compile(JaringanKecil(), backend="nope")
    with pytest.raises(ValueError, match="unknown mode"):
        tempa.compile(JaringanKecil(), mode="fastest")


@pytest.mark.passes_without_capture("reads tempa.config only")
def test_config_defaults_and_environment(monkeypatch):
    from tempa.configuration import _from_environment
    assert tempa.config.recompile_limit == 8
    assert tempa.config.cache_dir.endswith("tempa")
    monkeypatch.setenv("TEMPA_RECOMPILE_LIMIT", "3")
    monkeypatch.setenv("TEMPA_CACHE_DIR", "/tmp/somewhere")
    cfg = _from_environment()
    assert cfg.recompile_limit == 3 and cfg.cache_dir == "/tmp/somewhere"


def test_reset_clears_entries_and_counters():
    fast = tempa.compile(JaringanKecil(), backend="eager")
    fast(torch.randn(2, 32))
    assert tempa.stats().captures == 1
    tempa.reset()
    assert tempa.stats().captures == 0
    fast(torch.randn(2, 32))
    assert tempa.stats().captures == 1


def test_two_threads_share_one_compiled_model():
    model = JaringanKecil()
    fast = tempa.compile(model, backend="eager")
    inputs = [torch.randn(8, 32) for _ in range(4)]
    expected = [model(x) for x in inputs]
    errors = []

    def worker(k):
        try:
            for _ in range(50):
                for i, x in enumerate(inputs):
                    assert_same(fast(x), expected[i])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert tempa.stats().captures == 1


def test_is_compiling_is_true_during_capture():
    seen = []

    def f(x):
        if torch.compiler.is_compiling():
            return x + 1
        return x - 1

    fast = tempa.compile(f, backend="eager", fullgraph=True)
    assert_same(fast(torch.zeros(2)), torch.ones(2))


def test_deepcopy_and_pickle_compile_a_fresh_copy():
    # EMA / teacher copies: the copy wraps its own module and has its own compiled entries
    import copy
    import pickle
    model = JaringanKecil()
    fast = tempa.compile(model, backend="eager", dynamic=False)
    x = torch.randn(4, 32)
    fast(x)
    for twin in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
        assert isinstance(twin, tempa.OptimizedModule)
        assert twin._orig_mod is not model and twin.fc1.weight is not model.fc1.weight
        assert twin.__dict__["_tempa_context"] is not fast.__dict__["_tempa_context"]
        assert twin.__dict__["_tempa_context"].dynamic is False
        with torch.no_grad():
            twin.fc2.bias.add_(1.0)           # the copy's weights are its own
        assert torch.allclose(twin(x), model(x) + 1.0, atol=1e-6)
    assert torch.allclose(fast(x), model(x))
    assert tempa.stats().captures == 3        # each copy captured afresh


def test_shallow_copy_shares_the_module_and_keeps_wrapper_hooks():
    import copy
    model = JaringanKecil()
    fast = tempa.compile(model, backend="eager")
    fast.register_forward_hook(lambda mod, args, out: out * 2)
    twin = copy.copy(fast)
    x = torch.randn(2, 32)
    assert twin._orig_mod is model
    assert torch.allclose(twin(x), model(x) * 2)
    assert counts() == (1, 0, 0, 0)


def test_dropped_compiled_models_are_freed():
    # the module-watch registry must not keep entries (graphs, modules, weights) alive
    import gc
    import weakref
    refs = []
    for _ in range(3):
        model = JaringanKecil()
        fast = tempa.compile(model, backend="eager")
        fast(torch.randn(2, 32))
        refs.append(weakref.ref(model.fc1.weight))
        del model, fast
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    from tempa.capture import cache
    assert not cache._watchers        # the modules' slots went with them
    assert counts() == (3, 0, 0, 0)


def test_reassigning_a_watched_submodule_still_recaptures():
    model = JaringanKecil()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(2, 32)
    fast(x)
    model.fc2 = nn.Linear(64, 10)
    assert torch.allclose(fast(x), model(x))
    assert tempa.stats().captures == 2


@pytest.mark.passes_without_capture("it switches capture off and on itself")
def test_capture_off_runs_every_call_eagerly_until_switched_back_on(monkeypatch):
    monkeypatch.setattr(tempa.config, "capture", False)
    fast = tempa.compile(lambda x: x * 2)
    torch.testing.assert_close(fast(torch.ones(2)), torch.full((2,), 2.0))
    assert counts() == (0, 0, 0, 0) and tempa.entries(fast) == []
    monkeypatch.setattr(tempa.config, "capture", True)
    torch.testing.assert_close(fast(torch.ones(2)), torch.full((2,), 2.0))
    assert counts() == (1, 0, 0, 0) and len(tempa.entries(fast)) == 1
