"""Optimizer steps on the GPU (issue 16 item 3): eager ``opt.step()``, ``tempa.compile(opt.step)``
and ``torch.compile(opt.step)`` side by side in one process.

    python benchmarks/gpu_optimizer.py [--device cuda|cpu] [--reps 50]

Parameters: a GPT-2-small-like set (12 blocks of qkv 768x2304, proj 768x768, MLP 768x3072
and 3072x768 with biases, two LayerNorms each, 85M values, 148 tensors), gradients from
one random fill. SGD (momentum, nesterov), Adam, AdamW, RMSprop; foreach (torch's CUDA
default) and the per-parameter loop. Each system steps its own copy of the same parameters
and state; the step's time is the median of CUDA-event timings after warm-up (``--device
cpu``: wall clock, a smoke test of the script whose figures mean nothing). After the timed
steps every system's parameters are compared with eager's (all took the same number of steps
from the same start): the largest relative difference is printed.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import tempa  # noqa: E402

OPTIMIZERS = {
    "SGD momentum": lambda p, fe: torch.optim.SGD(p, lr=0.01, momentum=0.9, foreach=fe),
    "SGD nesterov": lambda p, fe: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True, foreach=fe),
    "Adam": lambda p, fe: torch.optim.Adam(p, lr=1e-3, foreach=fe),
    "AdamW": lambda p, fe: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=fe),
    "RMSprop": lambda p, fe: torch.optim.RMSprop(p, lr=1e-3, foreach=fe),
}


def gpt2_like_parameters(device, blocks=12, d=768):
    torch.manual_seed(0)
    shapes = []
    for _ in range(blocks):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,),
                   (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    params = [torch.nn.Parameter(torch.randn(s, device=device) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def timed_ms(step, device, warmup, reps):
    for _ in range(warmup):
        step()
    if device == "cuda":
        from gpu import median_ms
        return median_ms(step, warmup=0, reps=reps)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(kind, foreach, device, reps, base):
    rows = {}
    params = {}
    for system in ("eager", "tempa", "torch.compile"):
        ps = [torch.nn.Parameter(p.detach().clone()) for p in base]
        for p, b in zip(ps, base):
            p.grad = b.grad.clone()
        opt = OPTIMIZERS[kind](ps, foreach)
        if system == "tempa":
            tempa.reset()
            step = tempa.compile(opt.step)
        elif system == "torch.compile":
            torch._dynamo.reset()
            step = torch.compile(opt.step)
        else:
            step = opt.step
        try:
            t0 = time.perf_counter()
            step()
            if device == "cuda":
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            ms = timed_ms(step, device, warmup=5, reps=reps)
        except Exception as e:  # noqa: BLE001 - one system failing must not end the run
            rows[system] = f"FAILED {type(e).__name__}: {str(e)[:120]}"
            continue
        rows[system] = (ms, first_s, tempa.stats() if system == "tempa" else None)
        params[system] = ps
    diffs = {}
    for system, ps in params.items():
        diffs[system] = max(((a - b).norm() / (b.norm() + 1e-30)).item()
                            for a, b in zip(ps, params["eager"]))
    return rows, diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--only", default="", help="comma-separated optimizer names")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (--device cpu: a smoke test)")
    base = gpt2_like_parameters(a.device)
    where = torch.cuda.get_device_name() if a.device == "cuda" else "CPU smoke test"
    print(f"{where}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}; "
          f"{sum(p.numel() for p in base) / 1e6:.0f}M values in {len(base)} tensors; median ms a step\n")
    print("| optimizer | eager | tempa | torch.compile | tempa vs eager | tempa vs torch.compile "
          "| first call s (tempa / torch.compile) | max rel. diff vs eager (tempa / tc) | tempa |")
    print("|---|---|---|---|---|---|---|---|---|")
    kinds = [k for k in OPTIMIZERS if not a.only or k in a.only.split(",")]
    for kind in kinds:
        for foreach in (True, False):
            rows, diffs = run(kind, foreach, a.device, a.reps, base)
            cell = {s: (f"{r[0]:.3f}" if isinstance(r, tuple) else r) for s, r in rows.items()}
            ok = {s: r for s, r in rows.items() if isinstance(r, tuple)}
            ratio = lambda x, y: f"{ok[x][0] / ok[y][0]:.2f}x" if x in ok and y in ok else "—"  # noqa: E731
            first = " / ".join(f"{ok[s][1]:.1f}" if s in ok else "—" for s in ("tempa", "torch.compile"))
            diff = " / ".join(f"{diffs[s]:.1e}" if s in diffs else "—" for s in ("tempa", "torch.compile"))
            st = ok["tempa"][2] if "tempa" in ok else None
            # a graph the backend ran as ATen calls (a Triton build that failed, CPU step
            # counters) is no eager fallback of the frontend: said apart
            counts = (f"{st.captures} captures, {st.graph_breaks} breaks, {st.eager_fallbacks} eager, "
                      f"{st.aten_fallbacks} graphs as ATen" if st is not None else "")
            name = f"{kind} {'foreach' if foreach else 'for-loop'}"
            print(f"| {name} | {cell.get('eager')} | {cell.get('tempa')} | {cell.get('torch.compile')} "
                  f"| {ratio('eager', 'tempa')} | {ratio('torch.compile', 'tempa')} | {first} | {diff} "
                  f"| {counts} |", flush=True)


if __name__ == "__main__":
    main()
