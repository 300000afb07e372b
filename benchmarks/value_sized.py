"""A value-sized op in the middle of pointwise work, under two source trees of tempa.

    python benchmarks/value_sized.py BEFORE AFTER [--runs N] [--rounds N] [--sizes 1024,65536]

The program (``f`` below) computes pointwise values, picks the ones above a threshold with a
boolean mask (``y[y > 0.5]``: a result whose size only the run knows), and goes on with
pointwise work and reductions on both. Each tree's tempa is timed against eager in the same
process, interleaved, on one thread, by CPU time (``common.interleaved_us``); ``--runs``
fresh processes per tree alternate BEFORE, AFTER, BEFORE, ... (``common.run_trees``), so load
on a shared machine moves both alike. The table gives per tree the median µs per call of
eager and tempa, tempa's speedup and its graph counts (captures, breaks, recaptures).

Before issue 16 item 7, tempa broke the graph at the mask (the backend ran a graph holding
one as ATen calls): two graphs around the eager ``y[mask]``, and one recapture when the code
after it saw the new size. After it, one graph whose backend runs the mask as its ATen call
between two compiled pieces (backend/split_at_values.py), the second shape-generic in the
mask's length.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from common import run_trees

CHILD = r"""
import json, os, sys, time, warnings
tree, sizes, rounds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
sys.path.insert(0, tree)
import torch
import tempa
assert os.path.realpath(tempa.__file__).startswith(os.path.realpath(tree)), tempa.__file__
sys.path.insert(0, os.path.join(sys.argv[4]))
from common import interleaved_us
torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def f(x):
    y = (x * 1.5).relu().sin() + 0.25
    picked = y[y > 0.5]
    return picked.exp().sum() + (y * 3).cos().sum()


rows = []
for n in sizes:
    torch.manual_seed(0)
    tempa.reset()
    fast = tempa.compile(f)
    xs = [torch.randn(n) for _ in range(4)]
    for x in xs:                       # masks of several lengths before timing
        torch.testing.assert_close(fast(x), f(x), rtol=1e-5, atol=1e-4)
    s = tempa.stats()
    x = xs[0]
    cpu, _ = interleaved_us({"eager": (f, (x,)), "tempa": (fast, (x,))},
                            calls=max(20, 200000 // n), rounds=rounds)
    rows.append({"n": n, "eager": cpu["eager"], "tempa": cpu["tempa"],
                 "graphs": [s.captures, s.graph_breaks, s.recompiles]})
print(json.dumps(rows))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per tree (default 3)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds per process")
    ap.add_argument("--sizes", default="1024,65536")
    a = ap.parse_args()
    trees = [os.path.abspath(a.before), os.path.abspath(a.after)]
    here = os.path.dirname(os.path.abspath(__file__))
    measured = run_trees(trees, CHILD, a.runs, argv=lambda run, k: [trees[k], a.sizes,
                                                                     str(a.rounds), here])
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, 1 thread, CPU time; "
          f"{a.runs} processes per tree, {a.rounds} rounds each; load average at start "
          f"{measured.load_start:.2f}, at end {measured.load_end:.2f}\n"
          f"before: {trees[0]}\nafter:  {trees[1]}\n")
    print("| elements | eager µs | before: tempa µs | after: tempa µs | before: speedup | "
          "after: speedup | after / before | before: captures, breaks, recaptures | after: same |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, n in enumerate(int(s) for s in a.sizes.split(",")):
        per = []
        for runs in measured.results:
            rows = [r[i] for r in runs]
            per.append({k: statistics.median(r[k] for r in rows) for k in ("eager", "tempa")}
                       | {"graphs": tuple(rows[0]["graphs"]),
                          "speedup": statistics.median(r["eager"] / r["tempa"] for r in rows)})
        b, f = per
        eager = statistics.median([b["eager"], f["eager"]])
        print(f"| {n} | {eager:.1f} | {b['tempa']:.1f} | {f['tempa']:.1f} | {b['speedup']:.2f}x | "
              f"{f['speedup']:.2f}x | x{f['speedup'] / b['speedup']:.2f} | {b['graphs']} | "
              f"{f['graphs']} |")


if __name__ == "__main__":
    sys.exit(main())
