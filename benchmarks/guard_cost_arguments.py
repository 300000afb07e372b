"""What the guards cost a call with many tensor arguments (an HF StaticCache decode step
passes its cache tensors: 32 for a 16-layer model, each guarded, and which of them share
storage guarded once over all of them), two source trees side by side:

    python benchmarks/guard_cost_arguments.py BEFORE AFTER [--tensors 2,8,32] [--runs 3]

Each run is a fresh process per tree (trees alternating, see common.run_trees); the figure
is the median over runs of the per-call thread CPU time (µs, common.interleaved_us), no_grad,
one thread, of ``f(x, *caches)`` returning ``x * 2 + caches[0][0, 0]``: one small kernel, so
nearly all of it is the entry (guards) and the wrapper.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_trees  # noqa: E402

CHILD = r"""
import json, sys, torch, tempa
sys.path.insert(0, BENCH)
from common import interleaved_us
torch.set_num_threads(1)
def f(x, *caches):
    return x * 2 + caches[0][0, 0]
timed = {}
for n in map(int, sys.argv[1].split(",")):
    x, caches = torch.randn(4), [torch.randn(2, 3) for _ in range(n)]
    timed[n] = (tempa.compile(f), (x, *caches))
with torch.no_grad():
    cpu, _ = interleaved_us(timed)
print(json.dumps({str(n): us for n, us in cpu.items()}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--tensors", default="2,8,32")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    child = CHILD.replace("BENCH", repr(os.path.dirname(os.path.abspath(__file__))))
    got = run_trees(a.trees, child, a.runs, argv=[a.tensors])
    print(f"load average {got.load_start:.1f} -> {got.load_end:.1f}; µs per call (thread CPU), "
          f"median of {a.runs} runs")
    print("| tensor arguments | " + " | ".join(os.path.basename(t.rstrip("/")) or t for t in a.trees) + " |")
    print("|---|" + "---|" * len(a.trees))
    for n in a.tensors.split(","):
        cells = [statistics.median(r[n] for r in runs) for runs in got.results]
        print(f"| {n} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
