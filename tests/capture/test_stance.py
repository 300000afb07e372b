"""Stances (tempa.set_stance, as torch.compiler.set_stance) and the "auto" stance's
decision, checked by which path ran (stats, decisions), with an injected clock."""
import pytest
import torch

import tempa
from tempa import stance


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    tempa.set_stance("default")
    yield
    tempa.set_stance("default")
    tempa.reset()


def _counting_backend():
    calls = []

    def backend(gm, example_inputs):
        def run(*args):
            calls.append(1)
            return gm.forward(*args)
        return run
    return backend, calls


def f(x, n):
    return x * n + 1


def test_force_eager_runs_nothing_compiled_and_restores():
    backend, calls = _counting_backend()
    fast = tempa.compile(f, backend=backend)
    x = torch.ones(3)
    with tempa.set_stance("force_eager"):
        assert torch.equal(fast(x, 2), f(x, 2))
    assert calls == [] and tempa.stats().captures == 0
    assert tempa.stats().stance_eager_calls == 1
    fast(x, 2)                                   # default again: compiled
    assert calls == [1] and tempa.stats().captures == 1


def test_set_stance_as_decorator_applies_inside_only():
    backend, calls = _counting_backend()
    fast = tempa.compile(f, backend=backend)

    @tempa.set_stance("force_eager")
    def run_eagerly(x):
        return fast(x, 3)
    assert stance.state.name == "default"
    run_eagerly(torch.ones(2))
    assert calls == [] and stance.state.name == "default"
    fast(torch.ones(2), 3)        # outside the decorated function: compiled
    assert calls == [1]


def test_eager_on_recompile_keeps_entries_and_runs_new_inputs_eagerly():
    backend, calls = _counting_backend()
    fast = tempa.compile(f, backend=backend)
    x = torch.ones(3)
    fast(x, 2)                                   # compiled under default
    tempa.set_stance("eager_on_recompile")
    assert torch.equal(fast(x, 5), f(x, 5))      # n == 2 fails: eager, no recompile
    fast(x, 2)                                   # the entry still serves
    s = tempa.stats()
    assert (s.captures, s.recompiles, s.stance_eager_calls) == (1, 0, 1)
    assert len(calls) == 2


def test_fail_on_recompile_names_the_guard():
    fast = tempa.compile(f, backend="eager")
    x = torch.ones(3)
    with tempa.set_stance("fail_on_recompile"):
        fast(x, 2)                               # a first compile is no recompile
        with pytest.raises(tempa.RecompileError, match="n == 2"):
            fast(x, 7)
    assert tempa.stats().captures == 1


@pytest.mark.passes_without_capture("set_stance refuses the name itself")
def test_unknown_stance_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'eager_on_recompile'"):
        tempa.set_stance("sometimes")


class _Clock:
    """A fake timer for stance "auto": a timed call costs ``compiled`` seconds when the
    compiled code ran during it (the backend's callable counts its calls), else ``eager``."""

    def __init__(self, compiled_calls, compiled, eager):
        self.calls, self.compiled, self.eager = compiled_calls, compiled, eager
        self.now, self.started_at = 0.0, None

    def __call__(self):
        if self.started_at is None:               # the start of a timed call
            self.started_at = len(self.calls)
        else:                                      # its end
            self.now += self.compiled if len(self.calls) > self.started_at else self.eager
            self.started_at = None
        return self.now


@pytest.mark.parametrize("compiled_cost, eager_cost, kept", [(1.0, 5.0, "compiled"),
                                                             (5.0, 1.0, "eager")])
def test_auto_keeps_the_faster_path(monkeypatch, compiled_cost, eager_cost, kept):
    backend, compiled_calls = _counting_backend()
    monkeypatch.setattr(stance, "timer", _Clock(compiled_calls, compiled_cost, eager_cost))
    fast = tempa.compile(lambda x: x + 1, backend=backend)
    tempa.set_stance("auto")
    x = torch.zeros(2)
    for _ in range(stance.WARMUP + 2 * stance.ROUNDS + 4):
        assert torch.equal(fast(x), x + 1)
    decisions = tempa.stance_decisions(fast)
    said = "compiled code" if kept == "compiled" else "eager"
    assert len(decisions) == 1 and f"runs {said}: compiled {compiled_cost * 1e3:.2f} ms" in decisions[0]
    eager_calls = tempa.stats().stance_eager_calls
    if kept == "compiled":     # after the trial, every call runs compiled
        assert eager_calls == stance.ROUNDS
        assert len(compiled_calls) == stance.WARMUP + stance.ROUNDS + 4
    else:                      # after the trial, every call runs eagerly
        assert eager_calls == stance.ROUNDS + 4
        assert len(compiled_calls) == stance.WARMUP + stance.ROUNDS


@pytest.mark.passes_without_capture("a unit test of stance.AutoTrial's decisions")
def test_auto_trial_decision_logic():
    trial = stance.AutoTrial()
    paths = []
    for _ in range(stance.WARMUP):
        paths.append(trial.next_path())
        trial.record(paths[-1], None)
    times = {"compiled": [3, 3, 100, 3, 3], "eager": [4, 4, 4, 1, 4]}   # medians 3 vs 4
    done = False
    while not done:
        p = trial.next_path()
        paths.append(p)
        done = trial.record(p, times[p].pop(0))
    assert paths == ["compiled"] * stance.WARMUP + ["compiled", "eager"] * stance.ROUNDS
    assert trial.choice == "compiled" and trial.next_path() == "compiled"
