"""The seed MLP in the seed's own timing loop, eager against tempa, for several source trees.

The seed's pattern (10 warm-up calls, rounds of 200 calls, median of 7 rounds; the output
dropped after each call, so a grad-mode call also builds and frees its autograd graph), in
grad mode and under no_grad, eager and tempa rounds interleaved. Each tree runs in fresh
processes with ``PYTHONPATH`` set to it and its own disk cache, filled by one priming process
first (kernels, and the extensions tempa builds once: a cold cache is not what the seed's
loop measures); the trees' processes alternate (``--runs`` each, default 5). Per call, µs:
``cpu`` the calling thread's CPU time (on a shared machine it leaves out the waits for a
core), ``wall`` wall clock as the seed times it; medians over the runs of each tree.

    python benchmarks/seed_loop_ab.py /work/main .         # before / after
"""
from __future__ import annotations

import os
import statistics
import sys

from common import run_trees

PRIME = r"""
import sys, torch, tempa
sys.path.insert(0, sys.argv[1])
from seed_mlp import seed_setup
_model, x, _eager, fast = seed_setup()
fast(x)
with torch.no_grad():
    fast(x)
try:
    from tempa.backend.runtime import nativeautograd
except ImportError:
    nativeautograd = None
if nativeautograd is not None:
    nativeautograd.module()
"""

CHILD = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from common import interleaved_us
from seed_mlp import seed_setup

_model, x, eager, fast = seed_setup()
out = {}
for mode in ("grad", "no_grad"):
    with (torch.no_grad() if mode == "no_grad" else torch.enable_grad()):
        cpu, wall = interleaved_us({"eager": (eager, (x,)), "tempa": (fast, (x,))})
        out[mode] = {f"{k}_cpu": v for k, v in cpu.items()}
        out[mode].update({f"{k}_wall": v for k, v in wall.items()})
print(json.dumps(out))
"""


def main(argv: list[str]) -> None:
    runs = 5
    if "--runs" in argv:
        i = argv.index("--runs")
        runs, argv = int(argv[i + 1]), argv[:i] + argv[i + 2:]
    trees = argv or ["."]
    bench = os.path.dirname(os.path.abspath(__file__))
    measured = run_trees(trees, CHILD, runs, argv=[bench], prime=PRIME)
    print(f"seed MLP, seed's loop, {runs} alternating fresh processes per tree, medians, µs per "
          f"call (load average {measured.load_end:.1f})")
    print("| tree | mode | eager cpu | tempa cpu | eager/tempa cpu | eager wall | tempa wall | "
          "eager/tempa wall |")
    print("|---|---|---|---|---|---|---|---|")
    for t, runs_of_tree in zip(trees, measured.results):
        for mode in ("grad", "no_grad"):
            rs = [r[mode] for r in runs_of_tree]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            ratio_cpu = statistics.median(r["eager_cpu"] / r["tempa_cpu"] for r in rs)
            ratio_wall = statistics.median(r["eager_wall"] / r["tempa_wall"] for r in rs)
            print(f"| {t} | {mode} | {med['eager_cpu']:.2f} | {med['tempa_cpu']:.2f} | "
                  f"**{ratio_cpu:.2f}x** | {med['eager_wall']:.2f} | {med['tempa_wall']:.2f} | "
                  f"{ratio_wall:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
