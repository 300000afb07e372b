"""Dynamic shapes on CPU: the seed MLP served by one shape-generic graph.

    python benchmarks/dynamic.py

(1) Per-call time at batch 33 of the dynamic graph (reached after batch 8 then 9) vs a
    static graph compiled for batch 33 alone; target: within 10%.
(2) Total time over a sweep of 50 batch sizes (8..57), first calls included: eager, tempa,
    torch.compile (automatic dynamic in both compilers).
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from common import per_call_us  # noqa: E402
from tests.models import zoo  # noqa: E402


def sweep_seconds(fn, sizes, calls_per_size=20):
    t0 = time.perf_counter()
    for b in sizes:
        x = torch.randn(b, 32)
        for _ in range(calls_per_size):
            fn(x)
    return time.perf_counter() - t0


def main():
    model = zoo.make("mlp_seed").model
    x33 = torch.randn(33, 32)
    with torch.no_grad():
        tempa.reset()
        static = tempa.compile(model, dynamic=False)
        static(x33)
        t_static = per_call_us(static, x33)
        tempa.reset()
        dyn = tempa.compile(model)
        dyn(torch.randn(8, 32))
        dyn(torch.randn(9, 32))           # the recompile that makes the batch dim dynamic
        dyn(x33)
        t_dyn = per_call_us(dyn, x33)
        captures = tempa.stats().captures
        print("Seed MLP, batch 33, no_grad, per call µs (median)")
        print(f"  static graph {t_static:7.1f}   dynamic graph {t_dyn:7.1f}   "
              f"dynamic/static {t_dyn / t_static:5.2f}   (captures for the dynamic one: {captures})")

        sizes = list(range(8, 58))
        eager_s = sweep_seconds(model, sizes)
        tempa.reset()
        fast = tempa.compile(model)
        tempa_s = sweep_seconds(fast, sizes)
        tempa_caps = tempa.stats().captures
        torch._dynamo.reset()
        dynamo = torch.compile(model)
        dynamo_s = sweep_seconds(dynamo, sizes)
        print("\nSweep of 50 batch sizes (8..57), 20 calls each, first calls included, seconds")
        print(f"  eager {eager_s:7.2f}   tempa {tempa_s:7.2f} ({tempa_caps} captures)   "
              f"torch.compile {dynamo_s:7.2f}")


if __name__ == "__main__":
    main()
