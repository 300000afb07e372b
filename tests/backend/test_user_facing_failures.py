"""What a user sees when something outside tempa's control goes wrong (issue 20, points 5
and 9): an unwritable cache dir, a wrong input dtype, a backend failure in training."""
import warnings

import pytest
import torch

import tempa
from tempa.backend import entry as backend_entry
from tempa.backend.runtime import diskcache


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _tempa_warnings(caught):
    return [w for w in caught if str(w.message).startswith("tempa")]


def test_unwritable_cache_dir_compiles_in_a_private_dir_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(tempa.config, "cache_dir", str(blocker / "cache"))
    monkeypatch.setattr(diskcache, "_unwritable", {})

    def f(x):
        return torch.sin(x) * 3.25 + 0.5       # a kernel of its own (not in the cache)
    fast = tempa.compile(f)
    x = torch.randn(17)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (17, 18, 19):
            x = torch.randn(n)
            assert torch.allclose(fast(x), f(x), atol=1e-5)
    said = [w for w in _tempa_warnings(caught) if "cannot be written" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__
    assert tempa.stats().kernels_compiled > 0 and tempa.stats().aten_fallbacks == 0


def test_wrong_input_dtype_raises_eagers_error_quietly(capfd):
    model = torch.nn.Linear(4, 2)
    fast = tempa.compile(model)
    fast(torch.randn(3, 4))
    bad = torch.randn(3, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError) as eager_error:
        model(bad)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError) as compiled_error:
            fast(bad)
    assert str(compiled_error.value) == str(eager_error.value)
    assert _tempa_warnings(caught) == []
    assert "Traceback" not in capfd.readouterr().err      # no FX traceback printed
    s = tempa.stats()
    assert (s.captures, s.recompiles, s.aten_fallbacks) == (1, 0, 0)
    assert tempa.recompile_reasons(fast) == []


def test_backend_failure_warns_at_the_users_line_in_plain_words(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated lowering bug")
    monkeypatch.setattr(backend_entry, "trace_training", broken)
    model = torch.nn.Linear(4, 3)          # called without no_grad: the autograd variant
    fast = tempa.compile(model)
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fast(x)
    assert torch.allclose(out, model(x))
    said = _tempa_warnings(caught)
    assert len(said) == 1, [str(w.message) for w in said]
    text = str(said[0].message)
    assert "simulated lowering bug" in text and "training graph" not in text
    assert "with its backward" in text and "torch.no_grad()" in text
    assert said[0].filename == __file__


def test_recompile_limit_warning_points_at_the_users_line(monkeypatch):
    monkeypatch.setattr(tempa.config, "recompile_limit", 2)
    fast = tempa.compile(lambda x, n: x + n, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(4):   # a float: a changing int becomes a symbol, not a recompile
            fast(torch.zeros(2), n + 0.5)
    said = [w for w in _tempa_warnings(caught) if "recompile_limit" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__


def test_perf_channel_reports_cpu_compiles(caplog):
    import logging
    tempa.logs.enable("perf")
    fast = tempa.compile(lambda x: torch.cos(x) * 1.75 - 0.25)
    with caplog.at_level(logging.INFO, logger="tempa.perf"):
        fast(torch.randn(9))
    lines = [r.getMessage() for r in caplog.records if r.name == "tempa.perf"]
    assert any(l.startswith("tempa backend: graph compiled in ") and "kernels (" in l
               for l in lines), lines
