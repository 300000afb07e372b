"""Before and after on the GPU: the GPU rows timed under two source trees of tempa in one run.

    python benchmarks/gpu_trees.py BEFORE AFTER [--rows mlp,gpt_b1,...] [--runs N]
                                   [--modes default,reduce-overhead] [--budget-s S]

The GPU counterpart of ``trees.py``: a change to the backend has to show that no GPU row got
slower, and two separate runs on a lent machine minutes apart measure the machine as much as
the change. For each tree, ``--runs`` fresh processes (alternating BEFORE, AFTER, BEFORE, ...)
import that tree's ``tempa`` and time every row with AFTER's benchmark code: eager first,
then tempa in each mode. Rows are ``gpu.py``'s (mlp, gpt_b1, gpt_b8, gpt_train) and
``gpu_real.py``'s (bert, vit, llama_prefill, llama_decode, resnet50_tv, ...).

What is compared is each tree's speedup over eager measured in the same process (eager ms /
tempa ms: a slower or faster card in that process cancels), and the table gives per row and
mode the median speedup under each tree and their ratio (after / before: above 1 is faster).
Each cell's output is compared with eager's as in the scripts it borrows from.
``--budget-s``: a process starts no new row once that many seconds have passed since it
started (the cells it skipped are reported), so the whole run fits a lent machine's limit.
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
tree, after, rows, modes, budget = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(","), float(sys.argv[5])
start = time.perf_counter()
sys.path.insert(0, tree)
import torch
import tempa
assert os.path.realpath(tempa.__file__).startswith(os.path.realpath(tree)), tempa.__file__
sys.path.insert(1, after)                       # tests.models, from AFTER for both trees
sys.path.insert(0, os.path.join(after, "benchmarks"))
import gpu, gpu_real                            # their ``import tempa`` finds the tree's
warnings.filterwarnings("ignore")
GPT_ROWS = ("mlp", "gpt_b1", "gpt_b8", "gpt_train")
out = []
for key in rows:
    if time.perf_counter() - start > budget:
        out.append({"row": key, "error": "skipped: budget"})
        continue
    try:
        if key in GPT_ROWS:
            row = gpu.make_rows([key])[key]
            def cell(system, mode, row=row):
                ms, _, o, _ = gpu.run_cell(row, system, None if mode == "default" else mode, sys.stderr)
                return ms, o
            def err(o, ref, row=row):
                if row["train"]:
                    return abs(o.item() - ref.item()) / abs(ref.item())
                return gpu.rel_err(o, ref)
        else:
            row = gpu_real.make_row(key)
            if isinstance(row, str):
                out.append({"row": key, "error": row})
                continue
            def cell(system, mode, row=row):
                ms, _, o, _ = gpu_real.run_cell(row, system, mode)
                return ms, o
            def err(o, ref, row=row):
                return gpu_real.compare(o, ref, row.kind)[0]
        eager_ms, ref = cell("eager", "default")
        result = {"row": key, "eager": eager_ms}
        for mode in modes:
            try:
                ms, o = cell("tempa", mode)
                result[mode] = ms
                result[mode + " err"] = err(o, ref)
            except Exception as e:
                result[mode + " error"] = f"{type(e).__name__}: {e}"[:160]
            torch.cuda.empty_cache()
        out.append(result)
    except Exception as e:
        out.append({"row": key, "error": f"{type(e).__name__}: {e}"[:160]})
    torch.cuda.empty_cache()
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rows", default="mlp,gpt_b1,gpt_b8,gpt_train,bert,vit")
    ap.add_argument("--modes", default="default,reduce-overhead")
    ap.add_argument("--runs", type=int, default=2, help="fresh processes per tree (default 2)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="per process (default 240)")
    a = ap.parse_args()
    before, after = os.path.abspath(a.before), os.path.abspath(a.after)
    labels, rows, modes = ("before", "after"), a.rows.split(","), a.modes.split(",")

    def argv(run, k):
        return [(before, after)[k], after, a.rows, a.modes, str(a.budget_s)]

    def progress(run, k):
        print(f"run {run + 1}/{a.runs} {labels[k]} done", file=sys.stderr, flush=True)

    measured = run_trees([before, after], CHILD, a.runs, argv=argv, progress=progress)
    speedups = {(label, r, m): [] for label in labels for r in rows for m in modes}
    errs, problems = {}, {}
    for label, runs in zip(labels, measured.results):
        for results in runs:
            for res in results:
                r = res["row"]
                if "error" in res:
                    problems[(label, r)] = res["error"]
                    continue
                for m in modes:
                    if m in res:
                        speedups[(label, r, m)].append(res["eager"] / res[m])
                        errs[(label, r, m)] = max(errs.get((label, r, m), 0.0), res[m + " err"])
                    elif m + " error" in res:
                        problems[(label, r, m)] = res[m + " error"]
    import torch
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"{a.runs} processes per tree\nbefore: {before}\nafter:  {after}\n")
    print("| row | mode | before: tempa vs eager | after: tempa vs eager | after / before | err before / after |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for r in rows:
        for m in modes:
            b, f = speedups[("before", r, m)], speedups[("after", r, m)]
            if not b or not f:
                why = (problems.get(("after", r, m)) or problems.get(("before", r, m))
                       or problems.get(("after", r)) or problems.get(("before", r)) or "no result")
                print(f"| {r} | {m} | {statistics.median(b) if b else '—'} | "
                      f"{statistics.median(f) if f else '—'} | {why} | |")
                continue
            mb, mf = statistics.median(b), statistics.median(f)
            ratios.append(mf / mb)
            print(f"| {r} | {m} | {mb:.2f}x | {mf:.2f}x | x{mf / mb:.3f} | "
                  f"{errs[('before', r, m)]:.1e} / {errs[('after', r, m)]:.1e} |")
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"| **geomean** | | | | **x{geo:.3f}** | |")


if __name__ == "__main__":
    main()
