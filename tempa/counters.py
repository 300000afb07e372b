"""Counters of what tempa did, so users and tests can see which path ran.

A leaf module: capture, backend and api all count into the one ``counters`` object, and
``tempa.stats()`` hands out a snapshot of it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields


@dataclass
class Stats:
    captures: int = 0          # cache entries built (one per capture of a code object)
    recompiles: int = 0        # captures made because every existing entry's guards failed
    graph_breaks: int = 0      # breaks met while capturing
    eager_fallbacks: int = 0   # calls sent to eager because capture/compile could not help
    graphs_compiled: int = 0   # graphs handed to a backend
    kernels_compiled: int = 0  # generated kernels (C++ or Triton) built
    aten_fallbacks: int = 0    # ATen ops a backend ran as library calls instead of generating code
    disk_cache_hits: int = 0   # compiled artifacts loaded from the on-disk cache
    gcc_runs: int = 0          # times the C++ compiler was invoked
    stance_eager_calls: int = 0  # calls a stance ran eagerly (force_eager, eager_on_recompile,
    #                              auto) or config.measure_against_eager's trial did

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


counters = Stats()
_lock = threading.Lock()


def bump(name: str, n: int = 1) -> None:
    with _lock:
        setattr(counters, name, getattr(counters, name) + n)


def snapshot() -> Stats:
    with _lock:
        return Stats(**{f.name: getattr(counters, f.name) for f in fields(counters)})


def clear() -> None:
    with _lock:
        for f in fields(counters):
            setattr(counters, f.name, 0)
