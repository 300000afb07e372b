"""Dynamic shapes on CPU: one shape-generic graph serves every size.

    python benchmarks/dynamic.py [--no-gpt]

(1) Per-call time of the dynamic graph (reached after two sizes) vs a static graph compiled
    for that size alone, interleaved rounds, medians; target: within 10%. Seed MLP at
    batch 8, 33 and 57 (no_grad), and the test GPT (block 256) at (B, T) = (4, 64), (8, 128).
(2) Total time over a sweep of 50 batch sizes (8..57) of the seed MLP, first calls included,
    tempa starting from an empty cache directory: eager, tempa, torch.compile (automatic
    dynamic in both compilers), and the captures / gcc runs tempa needed.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from common import per_call_us  # noqa: E402
from tests.models import gpt as gpt_mod  # noqa: E402
from tests.models import zoo  # noqa: E402


def sweep_seconds(fn, sizes, calls_per_size=20):
    t0 = time.perf_counter()
    for b in sizes:
        x = torch.randn(b, 32)
        for _ in range(calls_per_size):
            fn(x)
    return time.perf_counter() - t0


def static_vs_dynamic(model, make_input, warm_sizes, sizes, rounds=7, calls=100):
    """[(size, static µs, dynamic µs)]; the dynamic graph is made by calling warm_sizes."""
    tempa.reset()
    dyn = tempa.compile(model)
    for s in warm_sizes:
        dyn(make_input(s))
    out = []
    captures = tempa.stats().captures
    for s in sizes:
        x = make_input(s)
        static = tempa.compile(model, dynamic=False)     # its own cache: dyn keeps its graph
        static(x)
        dyn(x)
        st, dy = [], []
        for _ in range(rounds):
            st.append(per_call_us(static, x, calls=calls, rounds=1, warmup=3))
            dy.append(per_call_us(dyn, x, calls=calls, rounds=1, warmup=3))
        out.append((s, statistics.median(st), statistics.median(dy)))
    # the dynamic callable captured only for warm_sizes; each static one captured once
    assert tempa.stats().captures == captures + len(sizes), "the dynamic graph was recaptured"
    return out


def main():
    warnings.filterwarnings("ignore")
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.2f}")
    model = zoo.make("mlp_seed").model
    with torch.no_grad():
        rows = static_vs_dynamic(model, lambda b: torch.randn(b, 32), [8, 9], [8, 33, 57])
        print("\nSeed MLP, no_grad, per call µs (median of interleaved rounds)")
        for b, st, dy in rows:
            print(f"  batch {b:3d}: static {st:7.1f}   dynamic {dy:7.1f}   dynamic/static {dy / st:5.2f}")
        if "--no-gpt" not in sys.argv:
            cfg = gpt_mod.small_config(block_size=256)
            torch.manual_seed(0)
            gpt = gpt_mod.GPT(cfg).eval()
            rows = static_vs_dynamic(gpt, lambda bt: torch.randint(0, cfg.vocab_size, bt),
                                        [(2, 16), (3, 17)], [(4, 64), (8, 128)], rounds=5, calls=20)
            print("\nTest GPT (2 layers, d=64, block 256), no_grad, per call µs")
            for bt, st, dy in rows:
                print(f"  (B, T) = {bt}: static {st:8.1f}   dynamic {dy:8.1f}   dynamic/static {dy / st:5.2f}")

        sizes = list(range(8, 58))
        eager_s = sweep_seconds(model, sizes)
        with tempfile.TemporaryDirectory() as d:
            old = tempa.config.cache_dir
            tempa.config.cache_dir = d
            tempa.reset()
            fast = tempa.compile(model)
            tempa_s = sweep_seconds(fast, sizes)
            s = tempa.stats()
            tempa.config.cache_dir = old
        torch._dynamo.reset()
        dynamo = torch.compile(model)
        dynamo_s = sweep_seconds(dynamo, sizes)
        print("\nSweep of 50 batch sizes (8..57), 20 calls each, first calls included, seconds "
              "(tempa from an empty cache)")
        print(f"  eager {eager_s:7.2f}   tempa {tempa_s:7.2f} ({s.captures} captures, {s.gcc_runs} gcc runs)"
              f"   torch.compile {dynamo_s:7.2f}")


if __name__ == "__main__":
    main()
