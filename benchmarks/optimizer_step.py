"""Optimizer steps on the CPU: eager vs tempa.compile(opt.step) vs torch.compile(opt.step).

    python benchmarks/optimizer_step.py [--quick]

--quick: SGD momentum, Adam and AdamW (for-loop and foreach), Linear(512, 512) layers (2.1M
values), 20 steps a round, eager and tempa only (torch.compile's warm-up alone takes ~25 s
per case on a shared 2-core machine).

An MLP of 8 Linear(1024, 1024) layers (16 parameters, 8.4M values); one backward fills the gradients, then only ``opt.step()`` is timed (it updates
parameters and state in place; repeated steps on the same gradients are still full steps). Each system gets its own twin
of the model, warmed up (tempa: the first step's graph creates the optimizer state, the
second recompiles once to read it; later steps reuse that graph). Per step µs, medians; ratio = eager / compiled (above 1: faster).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from common import per_call_us, seconds  # noqa: E402

OPTIMIZERS = {
    "SGD momentum": lambda p, fe: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=fe),
    "SGD nesterov": lambda p, fe: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True,
                                                  foreach=fe),
    "Adam": lambda p, fe: torch.optim.Adam(p, lr=1e-3, foreach=fe),
    "AdamW": lambda p, fe: torch.optim.AdamW(p, lr=1e-3, foreach=fe),
    "RMSprop": lambda p, fe: torch.optim.RMSprop(p, lr=1e-3, foreach=fe),
}


def _setup(kind, foreach, width):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(8)])
    model(torch.randn(32, width)).pow(2).mean().backward()
    return model, OPTIMIZERS[kind](model.parameters(), foreach)


def _measure(step, calls):
    first = seconds(step)   # eager: a step; tempa: captures the state's creation;
    second = seconds(step)  # torch.compile: compiles; tempa: the graph that reads the state
    return first + second, per_call_us(step, calls=calls, rounds=5, warmup=5)


def main():
    quick = "--quick" in sys.argv
    calls = 20 if quick else 50
    width = 512 if quick else 1024
    main_three = ("SGD momentum", "Adam", "AdamW")
    cases = [(k, fe) for fe in (False, True) for k in main_three] if quick else \
        [(k, False) for k in OPTIMIZERS] + [(k, True) for k in main_three]
    rows = []
    for kind, foreach in cases:
        _, opt = _setup(kind, foreach, width)
        _, eager = _measure(opt.step, calls)
        tempa.reset()
        _, opt = _setup(kind, foreach, width)
        t_warm, t = _measure(tempa.compile(opt.step), calls)
        s = tempa.stats()
        # the state's creation, then one graph reused by every later step
        assert (s.captures, s.recompiles, s.graph_breaks) == (2, 1, 0), s
        rows.append([kind, foreach, eager, t, t_warm])
        print(f"{kind}{' foreach' if foreach else ''}: {s.kernels_compiled} kernels, "
              f"{s.aten_fallbacks} ATen fallbacks", flush=True)
    # torch.compile last: Dynamo wraps optimizer internals (_init_group) in
    # torch._dynamo.disable for the rest of the process, which tempa then honours.
    for row in rows:
        if quick:
            row += [float("nan"), float("nan")]
            continue
        torch._dynamo.reset()
        _, opt = _setup(row[0], row[1], width)
        d_warm, d = _measure(torch.compile(opt.step), calls)
        row += [d, d_warm]
    print(f"{'optimizer':22s} {'eager':>8s} {'tempa':>8s} {'ratio':>6s} {'warm-up':>8s} "
          f"{'torch.compile':>14s} {'ratio':>6s} {'warm-up':>8s}")
    for kind, foreach, eager, t, t_warm, d, d_warm in rows:
        name = f"{kind}{' foreach' if foreach else ''}"
        print(f"{name:22s} {eager:8.0f} {t:8.0f} {eager / t:5.2f}x {t_warm:7.2f}s "
              f"{d:14.0f} {eager / d:5.2f}x {d_warm:7.2f}s")
    print("(per step µs, medians after warm-up; warm-up = the first two steps' time)")


if __name__ == "__main__":
    main()
