"""Capture time and per-call overhead of the frontend, side by side with torch.compile.

    python benchmarks/capture.py            # prints two tables

(1) Capture time of a GPT-124M-sized model (12 layers, d=768; batch 1, T=64): first call
    minus one eager call, for tempa (backend="eager": capture only, the FX graph runs as is)
    and torch.compile(backend="eager") (Dynamo's capture only). Median of 3 fresh runs.
(2) Per-call overhead on a tiny function: eager, the captured FX graph called directly,
    tempa (guards + dispatch + the same graph), torch.compile(backend="eager"). Medians of
    tight loops; tempa's own cost is tempa minus the direct graph call.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from tests.models import gpt as gpt_mod  # noqa: E402


def first_call_seconds(compile_fn, model, x, eager_s):
    t0 = time.perf_counter()
    fast = compile_fn(model)
    fast(x)
    return time.perf_counter() - t0 - eager_s


def capture_table(rounds=3):
    torch.manual_seed(0)
    model = gpt_mod.GPT(gpt_mod.gpt124m_config()).eval()
    x = torch.randint(0, 50304, (1, 64))
    with torch.no_grad():
        model(x)
        t0 = time.perf_counter()
        model(x)
        eager_s = time.perf_counter() - t0
        rows = {}
        for name, fn in [("tempa", lambda m: tempa.compile(m, backend="eager")),
                         ("torch.compile", lambda m: torch.compile(m, backend="eager"))]:
            times = []
            for _ in range(rounds):
                tempa.reset()
                torch._dynamo.reset()
                times.append(first_call_seconds(fn, model, x, eager_s))
            rows[name] = statistics.median(times)
    print("Capture time, GPT-124M (12 layers, d=768), batch 1, T=64, no_grad; median of",
          rounds, "runs")
    print(f"{'':16s} {'seconds':>8s} {'vs torch.compile':>17s}")
    for name, s in rows.items():
        print(f"{name:16s} {s:8.3f} {rows['torch.compile'] / s:16.1f}x")
    return rows


def per_call(fn, *args, n=20000, repeat=7):
    for _ in range(200):
        fn(*args)
    best = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        best.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(best)


def overhead_table():
    def f(x):
        return x + 1

    x = torch.randn(8)
    tempa.reset()
    fast = tempa.compile(f, backend="eager")
    fast(x)
    graph = tempa.entries(fast)[0].graph
    dynamo = torch.compile(f, backend="eager")
    dynamo(x)
    with torch.no_grad():
        rows = {
            "eager": per_call(f, x),
            "FX graph directly": per_call(graph, x),
            "tempa": per_call(fast, x),
            "torch.compile": per_call(dynamo, x),
        }
    print("\nPer-call time of f(x) = x + 1 on 8 floats, no_grad, µs (median of 7 loops)")
    for name, us in rows.items():
        print(f"{name:20s} {us:7.2f}")
    print(f"{'tempa overhead':20s} {rows['tempa'] - rows['FX graph directly']:7.2f}  "
          "(guards + dispatch over calling the graph directly)")
    return rows


if __name__ == "__main__":
    capture_table()
    overhead_table()
