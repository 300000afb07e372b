"""Capture time and per-call overhead of the frontend, side by side with torch.compile.

    python benchmarks/capture.py            # prints two tables

(1) Capture time of a GPT-124M-sized model (12 layers, d=768; batch 1, T=64): from the
    first call's start until a custom backend receives the graph, for tempa and for
    torch.compile (Dynamo's capture), each in a fresh process: cold = the first capture
    there (including one-time imports), warm = median of later captures.
(2) Per-call overhead on a tiny function: eager, the captured FX graph called directly,
    tempa (guards + dispatch + the same graph), torch.compile(backend="eager"). Medians of
    tight loops; tempa's own cost is tempa minus the direct graph call.
"""
from __future__ import annotations

import os
import json
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from tests.models import gpt as gpt_mod  # noqa: E402


def _first_call(which: str, rounds: int) -> list[float]:
    """Seconds from the first call's start until the backend receives the captured graph
    (capture only: no kernels, and no model compute, since both systems hand the graph to
    a backend before running anything). ``rounds`` times in this process: the first round
    also pays one-time imports (e.g. torch's fake-tensor machinery)."""
    torch.manual_seed(0)
    model = gpt_mod.GPT(gpt_mod.gpt124m_config()).eval()
    x = torch.randint(0, 50304, (1, 64))
    out = []
    with torch.no_grad():
        for _ in range(rounds):
            reached = []

            def backend(gm, example_inputs):
                reached.append(time.perf_counter())
                return gm.forward

            if which == "tempa":
                tempa.reset()
                fast = tempa.compile(model, backend=backend)
            else:
                torch._dynamo.reset()
                fast = torch.compile(model, backend=backend)
            t0 = time.perf_counter()
            fast(x)
            out.append(reached[0] - t0)
    return out


def capture_table(rounds=4):
    """Each system in a fresh process: cold = its first capture, warm = median of the rest."""
    rows = {}
    for which in ("tempa", "torch.compile"):
        res = subprocess.run([sys.executable, __file__, "--one", which, str(rounds)],
                             capture_output=True, text=True, check=True)
        times = json.loads(res.stdout.strip().splitlines()[-1])
        rows[which] = (times[0], statistics.median(times[1:]))
    print("Capture time, GPT-124M (12 layers, d=768), batch 1, T=64, no_grad, seconds")
    print("(first call's start until the backend gets the graph; each system in a fresh process)")
    print(f"{'':16s} {'cold':>7s} {'warm':>7s} {'warm vs torch.compile':>22s}")
    for name, (cold, warm) in rows.items():
        print(f"{name:16s} {cold:7.3f} {warm:7.3f} {rows['torch.compile'][1] / warm:21.1f}x")
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
            "FX graph directly": per_call(graph.forward, x),
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
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(json.dumps(_first_call(sys.argv[2], int(sys.argv[3]))))
    else:
        capture_table()
        overhead_table()
