"""Stances: how compiled functions behave for a while, as ``torch.compiler.set_stance``.

    tempa.set_stance("force_eager")           # from now on
    with tempa.set_stance("eager_on_recompile"):  # for a block (or @tempa.set_stance(...))
        ...

- ``default``: compile on a miss (up to ``recompile_limit``), run compiled code.
- ``force_eager``: run every compiled function eagerly; nothing is captured or compiled.
- ``eager_on_recompile``: entries that exist still serve their calls; a call that would
  recompile runs eagerly instead (a first compile still happens).
- ``fail_on_recompile``: such a call raises ``RecompileError`` naming the failing guard.
- ``auto``: compile as by default; then, per compiled function (each code object: a
  function, a forward, a resume function after a graph break), after ``WARMUP`` calls of its
  compiled code, the next ``2 * ROUNDS`` calls alternate between the compiled code and
  eager, each call timed, on the live inputs. The faster median is kept for good: a compiled
  model is then never slower than eager at its own inputs. Each call runs exactly one of the
  two, so side effects happen once, as in eager. Only the forward is timed (a backward runs
  as its forward chose). The decision is logged (``TEMPA_LOGS=perf``; an eager choice also
  on ``fallbacks``), and ``tempa.stance_decisions(compiled)``, ``tempa explain`` and the
  report show it.

``tempa.config.measure_against_eager`` runs the same trial under any stance but keeps the
compiled code whatever it measures: it only says which functions measured slower than eager
(on ``fallbacks``, in ``tempa.stance_decisions`` and ``tempa explain``).

Why alternate instead of timing both paths on one call: running the function twice would
repeat its side effects (in-place updates, RNG draws). Why medians of interleaved calls:
machine load drifts; alternating puts both paths under the same drift, and a median ignores
the odd slow call (a capture, a page fault).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile", "auto")
WARMUP = 3          # compiled calls before timing starts (caches, allocator, branch warm-up)
ROUNDS = 5          # timed calls per path


class RecompileError(RuntimeError):
    """Raised under ``fail_on_recompile`` when a call would recompile."""


class _CurrentStance:
    """The stance in force now, for the whole process (``state``)."""
    name = "default"
    active = False      # not "default": dispatchers consult this module


state = _CurrentStance()
timer = time.perf_counter   # tests inject a fake clock here


def set_stance(stance: str = "default"):
    """Switch the stance now; the returned object restores the previous one when used as
    a context manager (``with``) and applies its stance around each call when used as a
    decorator."""
    if stance not in STANCES:
        raise ValueError(f"tempa.set_stance: unknown stance {stance!r}; the stances are "
                         f"{', '.join(map(repr, STANCES))}")
    previous = state.name
    _switch(stance)
    return _StanceScope(stance, previous)


def _switch(name: str) -> None:
    state.name = name
    state.active = name != "default"


class _StanceScope(contextlib.ContextDecorator):
    def __init__(self, stance: str, previous: str):
        self.stance, self.previous, self._outer = stance, previous, []
        self._switched = True       # set_stance switched already: the first `with` undoes it

    def __enter__(self):
        self._outer.append(self.previous if self._switched else state.name)
        self._switched = False
        _switch(self.stance)
        return self

    def __exit__(self, *exc):
        _switch(self._outer.pop())
        return False

    def __call__(self, fn):
        # As a decorator, right after set_stance(...) switched: switch back, so that the
        # stance applies inside fn only.
        _switch(self.previous)
        self._switched = False
        return super().__call__(fn)


@dataclass
class AutoTrial:
    """One code object's trial under ``auto``: its timings and, once made, the choice.
    ``switch``: whether later calls take the faster path (stance ``auto``) or stay compiled
    (``config.measure_against_eager``, which only measures and says so)."""
    compiled_calls: int = 0
    compiled_times: list = field(default_factory=list)
    eager_times: list = field(default_factory=list)
    choice: str | None = None       # the faster path: "compiled" or "eager"
    switch: bool = True

    def next_path(self) -> str:
        """Which path the next call takes (and whether it is timed)."""
        if self.choice is not None:
            return self.choice if self.switch else "compiled"
        if self.compiled_calls < WARMUP:
            return "compiled"
        # interleaved: compiled, eager, compiled, eager, ...
        return "eager" if len(self.eager_times) < len(self.compiled_times) else "compiled"

    def record(self, path: str, seconds: float | None) -> bool:
        """Note one call; True when this call completed the trial (the choice was made)."""
        if path == "compiled":
            self.compiled_calls += 1
            if seconds is None:
                return False
            self.compiled_times.append(seconds)
        else:
            self.eager_times.append(seconds)
        if len(self.compiled_times) >= ROUNDS and len(self.eager_times) >= ROUNDS:
            faster = self.median("compiled") <= self.median("eager")
            self.choice = "compiled" if faster else "eager"
            return True
        return False

    def timed(self) -> bool:
        return self.choice is None and self.compiled_calls >= WARMUP

    def median(self, path: str) -> float:
        return statistics.median(self.compiled_times if path == "compiled" else self.eager_times)

    def describe(self, name: str) -> str:
        times = (f"compiled {_time(self.median('compiled'))} vs eager "
                 f"{_time(self.median('eager'))} per call (medians of {ROUNDS} interleaved "
                 "calls each, on live inputs)")
        if not self.switch:
            if self.choice == "eager":
                return (f"measured slower than eager: {name}: {times}; it still runs its "
                        "compiled code (tempa.set_stance('auto') would run it eagerly)")
            return f"measured against eager: {name} is faster compiled: {times}"
        kept = "compiled code" if self.choice == "compiled" else "eager"
        slower = "; its compiled code measured slower than eager" if self.choice == "eager" else ""
        return f"stance auto: {name} runs {kept}: {times}{slower}"


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"
