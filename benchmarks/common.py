"""Shared timing helpers: warm-up, tight loops, medians, ratios."""
from __future__ import annotations

import statistics
import time


def per_call_us(fn, *args, calls: int = 200, rounds: int = 7, warmup: int = 10, **kwargs) -> float:
    """The seed's pattern: warm-up calls, then `calls` calls timed; median over rounds."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def seconds(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0
