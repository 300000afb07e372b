"""Optimizer steps on the CPU, eager, tempa.compile(opt.step) and torch.compile(opt.step)
timed in alternation in one process on one thread, by thread CPU time: each round times 10
eager steps, then 10 of tempa's, then 10 of torch.compile's, so a burst of load from other
processes hits all three alike (optimizer_step.py times the systems one after the other,
which a loaded machine skews by several times).

    python benchmarks/optimizer_interleaved.py [--rounds 7] [--no-torch-compile]

Run it under two trees for a before/after (``PYTHONPATH=TREE``, a fresh TEMPA_CACHE_DIR each).
Model: 8 Linear(512, 512) layers (16 parameters, 2.1M values), gradients from one backward;
SGD with momentum and Adam, for-loop and foreach. Each system steps its own twin of the
model; each is warmed up by 3 steps (the state is made, then the graphs that read it are
compiled: torch.compile(opt.step) is called after the first eager step has made the state,
as its docs advise). Prints per-step µs (medians), the ratios eager / tempa, eager /
torch.compile and torch.compile / tempa (above 1: the second is faster), the largest
parameter difference from eager after the steps, and tempa's counters.
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


def _max_diff(reference, model):
    return max((a - b).abs().max().item()
               for a, b in zip(reference.parameters(), model.parameters()))


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 7
    with_torch_compile = "--no-torch-compile" not in sys.argv
    torch.set_num_threads(1)
    for kind in OPTIMIZERS:
        for foreach in (False, True):
            tempa.reset()
            eager_model, eager_opt = _setup(kind, foreach)
            models, steps = {"eager": eager_model}, {"eager": eager_opt.step}
            models["tempa"], opt = _setup(kind, foreach)
            steps["tempa"] = tempa.compile(opt.step)
            if with_torch_compile:
                models["torch.compile"], dynamo_opt = _setup(kind, foreach)
                dynamo_opt.step()                   # the state, made eagerly
                eager_opt.step()
                opt.step()
                steps["torch.compile"] = torch.compile(dynamo_opt.step)
            for _ in range(3):          # state creation, then the graphs that read it
                for step in steps.values():
                    step()
            times = {name: [] for name in steps}
            for _ in range(rounds):
                for name, step in steps.items():
                    times[name].append(_cpu_us(step))
            us = {name: statistics.median(t) for name, t in times.items()}
            name = f"{kind}{' foreach' if foreach else ''}"
            line = (f"{name:22s} eager {us['eager']:7.0f} µs  tempa {us['tempa']:7.0f} µs  "
                    f"eager/tempa {us['eager'] / us['tempa']:5.2f}x")
            if with_torch_compile:
                tc = us["torch.compile"]
                line += (f"  torch.compile {tc:7.0f} µs  eager/torch.compile "
                         f"{us['eager'] / tc:5.2f}x  torch.compile/tempa {tc / us['tempa']:5.2f}x")
            diffs = "  ".join(f"{n} {_max_diff(eager_model, m):.1e}"
                              for n, m in models.items() if n != "eager")
            print(f"{line}  max diff from eager: {diffs}  tempa: {tempa.stats()}", flush=True)


if __name__ == "__main__":
    main()
