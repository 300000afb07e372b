"""Before and after in one run on the real-size models: real_models.py's rows under two trees.

    python benchmarks/real_trees.py BEFORE AFTER --rows gpt2:train,vit:infer,... [--size quick]
                                    [--runs N] [--rounds N]

trees.py does this for the zoo's small models; this is the same for ``hf_models.py``'s real-size
ones. For each tree, ``--runs`` fresh processes (alternating BEFORE, AFTER, BEFORE, ...) import
that tree's ``tempa`` and run ``real_models.bench_row`` (from AFTER, so both trees run the same
models and the same float64 check) for every row, on one thread and timed by CPU time. What is
compared is each tree's speedup over eager measured in the same process (eager time / tempa
time), so load that slows a whole process cancels; the table gives the median speedup per tree
and their ratio (after / before: above 1 is faster). A row whose compiled result fails the
float64 check is reported as MISMATCH.
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
tree, after_benchmarks, rows, size, rounds = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4], int(sys.argv[5])
sys.path.insert(0, tree)
import torch
import tempa
assert os.path.realpath(tempa.__file__).startswith(os.path.realpath(tree)), tempa.__file__
sys.path.insert(0, after_benchmarks)
import models, real_models          # their ``import tempa`` finds the tree's, already loaded
torch.set_num_threads(1)
models.CLOCK = time.thread_time
warnings.filterwarnings("ignore")
import transformers
transformers.logging.set_verbosity_error()
out = []
for row in rows:
    name, mode = row.split(":")
    try:
        r = real_models.bench_row(name, size, mode == "train", False, rounds)
        out.append({"row": row, "eager": r["eager_us"], "tempa": r["tempa_us"]})
    except real_models.Mismatch as e:
        out.append({"row": row, "error": f"MISMATCH {e}"[:160]})
    except Exception as e:  # a row one tree cannot run is reported, not fatal
        out.append({"row": row, "error": f"{type(e).__name__}: {e}"[:160]})
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rows", required=True, help="model:mode,... (mode infer or train)")
    ap.add_argument("--size", default="quick", choices=["quick", "default", "larger"])
    ap.add_argument("--runs", type=int, default=2, help="fresh processes per tree (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row")
    a = ap.parse_args()
    before, after = os.path.abspath(a.before), os.path.abspath(a.after)
    rows = a.rows.split(",")
    labels = ("before", "after")
    args = [None, None]
    for k, tree in enumerate((before, after)):
        args[k] = [tree, os.path.join(after, "benchmarks"), ",".join(rows), a.size, str(a.rounds)]

    def progress(run, k):
        print(f"run {run + 1}/{a.runs} {labels[k]} done ({time.strftime('%H:%M')}, load "
              f"{os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    measured = run_trees([before, after], CHILD, a.runs, argv=lambda run, k: args[k], progress=progress)
    speedups = {label: {r: [] for r in rows} for label in labels}
    errors = {}
    for label, runs in zip(labels, measured.results):
        for out in runs:
            for r in out:
                if "error" in r:
                    errors[(label, r["row"])] = r["error"]
                else:
                    speedups[label][r["row"]].append(r["eager"] / r["tempa"])
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, size {a.size}, {os.cpu_count()} cores, 1 thread, "
          f"CPU time; {a.runs} processes per tree, {a.rounds} rounds per row; load average at "
          f"start {measured.load_start:.2f}, at end {measured.load_end:.2f}\nbefore: {before}\n"
          f"after:  {after}\n")
    print("| row | before: tempa speedup (per run) | after: tempa speedup (per run) | after / before |")
    print("|---|---|---|---|")
    ratios = []
    for r in rows:
        b, f = speedups["before"][r], speedups["after"][r]
        if not b or not f:
            why = errors.get(("after", r)) or errors.get(("before", r)) or "no result"
            print(f"| {r} | {b} | {f} | {why} |")
            continue
        mb, mf = statistics.median(b), statistics.median(f)
        ratios.append(mf / mb)
        runs_b = " / ".join(f"{x:.2f}" for x in b)
        runs_f = " / ".join(f"{x:.2f}" for x in f)
        print(f"| {r} | {mb:.2f}x ({runs_b}) | {mf:.2f}x ({runs_f}) | x{mf / mb:.3f} |")
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"| **geomean** | | | **x{geo:.3f}** |")
    for (label, r), e in sorted(errors.items()):
        print(f"- {label} {r}: {e}")


if __name__ == "__main__":
    main()
