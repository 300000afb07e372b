"""Optimizer steps on the CPU, eager and tempa.compile(opt.step) timed in alternation in one
process on one thread, by thread CPU time: each round times 10 eager steps then 10 compiled
ones, so a burst of load from other processes hits both alike (optimizer_step.py times the
systems one after the other, which a loaded machine skews by several times).

    python benchmarks/optimizer_interleaved.py [--rounds 7]

Run it under two trees for a before/after (``PYTHONPATH=TREE``, a fresh TEMPA_CACHE_DIR each).
Model: 8 Linear(512, 512) layers (16 parameters, 2.1M values), gradients from one backward;
SGD with momentum and Adam, for-loop and foreach. Prints per-step µs (medians), eager / tempa,
the largest parameter difference after the steps, and tempa's counters.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import tempa

OPTIMIZERS = {
    "SGD momentum": lambda p, fe: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=fe),
    "Adam": lambda p, fe: torch.optim.Adam(p, lr=1e-3, foreach=fe),
}


def _setup(kind, foreach):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])
    model(torch.randn(32, 512)).pow(2).mean().backward()
    return model, OPTIMIZERS[kind](model.parameters(), foreach)


def _cpu_us(step, calls=10):
    t0 = time.thread_time()
    for _ in range(calls):
        step()
    return (time.thread_time() - t0) / calls * 1e6


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    torch.set_num_threads(1)
    for kind in OPTIMIZERS:
        for foreach in (False, True):
            tempa.reset()
            eager_model, eager_opt = _setup(kind, foreach)
            model, opt = _setup(kind, foreach)
            step = tempa.compile(opt.step)
            for _ in range(3):          # state creation, then the graph that reads it
                eager_opt.step()
                step()
            eager_us, tempa_us = [], []
            for _ in range(rounds):
                eager_us.append(_cpu_us(eager_opt.step))
                tempa_us.append(_cpu_us(step))
            diff = max((a - b).abs().max().item()
                       for a, b in zip(eager_model.parameters(), model.parameters()))
            e, t = statistics.median(eager_us), statistics.median(tempa_us)
            name = f"{kind}{' foreach' if foreach else ''}"
            print(f"{name:22s} eager {e:8.0f} µs  tempa {t:8.0f} µs  eager/tempa {e / t:5.2f}x  "
                  f"max diff {diff:.1e}  {tempa.stats()}", flush=True)


if __name__ == "__main__":
    main()
