"""Before and after in one run: the zoo's CPU models timed under two source trees of tempa.

    python benchmarks/trees.py BEFORE AFTER [--only NAME[,NAME...]] [--runs N] [--rounds N]
                               [--torch-compile]

A change to the backend or the per-call path has to show that no model got slower. Timing
the two trees in separate runs minutes apart on a shared machine measures the load, not the
change, so this script runs both in one go: for each tree, ``--runs`` fresh processes
(alternating BEFORE, AFTER, BEFORE, ...), each importing that tree's ``tempa`` and timing
every model of ``tests/models/zoo.py`` (from AFTER, so both trees run the same models) with
``benchmarks/models.py``'s interleaved eager-vs-tempa loop, on one thread and by CPU time.

What is compared is each tree's speedup over eager measured in the same process (eager time
/ tempa time), so load that slows a whole process cancels; the table gives the median
speedup per tree and their ratio (after / before: above 1 is faster). ``--torch-compile``
adds torch.compile's speedup, measured once in the last AFTER process, for reference.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

from common import run_trees

CHILD = r"""
import json, os, sys, time, warnings
tree, after_benchmarks, names, rounds, use_tc = sys.argv[1], sys.argv[2], sys.argv[3].split(","), int(sys.argv[4]), sys.argv[5] == "1"
sys.path.insert(0, tree)
import torch
import tempa
assert os.path.realpath(tempa.__file__).startswith(os.path.realpath(tree)), tempa.__file__
sys.path.insert(0, after_benchmarks)
import models                       # its own ``import tempa`` finds the tree's, already loaded
torch.set_num_threads(1)
models.CLOCK = time.thread_time
warnings.filterwarnings("ignore")
torch.manual_seed(0)
rows = []
for name in names:
    try:
        rows.append(models.bench_case(name, use_tc, rounds))
    except Exception as e:  # a model one tree cannot run is reported, not fatal
        rows.append({"name": name, "error": f"{type(e).__name__}: {e}"[:120]})
print(json.dumps(rows))
"""


def zoo_names(after: str) -> list:
    sys.path.insert(0, after)
    from tests.models import zoo
    return [n for n in zoo.ALL if n != "graph_break_seed"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--only", default="")
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per tree (default 3)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per process")
    ap.add_argument("--torch-compile", action="store_true")
    a = ap.parse_args()
    before, after = os.path.abspath(a.before), os.path.abspath(a.after)
    names = zoo_names(after)
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    labels = ("before", "after")

    def argv(run, k):
        use_tc = a.torch_compile and labels[k] == "after" and run == a.runs - 1
        return [(before, after)[k], os.path.join(after, "benchmarks"), ",".join(names),
                str(a.rounds), "1" if use_tc else "0"]

    def progress(run, k):
        print(f"run {run + 1}/{a.runs} {labels[k]} done", file=sys.stderr, flush=True)

    measured = run_trees([before, after], CHILD, a.runs, argv=argv, progress=progress)
    speedups = {"before": {n: [] for n in names}, "after": {n: [] for n in names}}
    errors, tc = {}, {}
    for label, runs in zip(labels, measured.results):
        for rows in runs:
            for row in rows:
                name = row["name"]
                if "error" in row:
                    errors[(label, name)] = row["error"]
                    continue
                speedups[label][name].append(row["eager"] / row["tempa"])
                if "torch.compile" in row:
                    tc[name] = row["eager"] / row["torch.compile"]
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, 1 thread, CPU time; "
          f"{a.runs} processes per tree, {a.rounds} rounds each; load average at start "
          f"{measured.load_start:.2f}, at end {measured.load_end:.2f}\nbefore: {before}\nafter:  {after}\n")
    print("| model | before: tempa speedup | after: tempa speedup | after / before |"
          + (" torch.compile speedup |" if a.torch_compile else ""))
    print("|---|---|---|---|" + ("---|" if a.torch_compile else ""))
    ratios = []
    for n in names:
        b, f = speedups["before"][n], speedups["after"][n]
        if not b or not f:
            why = errors.get(("after", n)) or errors.get(("before", n)) or "no result"
            print(f"| {n} | {statistics.median(b) if b else '—'} | "
                  f"{statistics.median(f) if f else '—'} | {why} |")
            continue
        mb, mf = statistics.median(b), statistics.median(f)
        ratios.append(mf / mb)
        extra = f" {tc[n]:.2f}x |" if n in tc else (" — |" if a.torch_compile else "")
        print(f"| {n} | {mb:.2f}x | {mf:.2f}x | x{mf / mb:.3f} |" + extra)
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"| **geomean** | | | **x{geo:.3f}** |" + (" |" if a.torch_compile else ""))


if __name__ == "__main__":
    main()
