"""What guards cost: the seed MLP's per-call time compiled, and where that time goes.

Each source tree runs in fresh processes with ``PYTHONPATH`` set to it, so one run compares
two versions of tempa side by side (same machine, same minutes); the trees' processes
alternate (``--runs`` each, default 3) and each figure is the median over a tree's runs of
the per-run medians, so a burst of load on a shared machine moves both trees alike:

    python benchmarks/guard_cost.py /work/wt/base .      # before / after
    python benchmarks/guard_cost.py                      # this tree only

Per call, in µs (timing as in benchmarks/common.py: warm-up, 200 calls a round, median of
7 rounds; the rounds of the parts below interleave, so they add up under changing load).
``call_wall`` is wall-clock time; the others are the calling thread's CPU time, which on a
shared machine leaves out the time the process waits for a core (the compiled graph of
this small model runs on the calling thread alone):
  call_wall ``fast(x)``, what the user sees, wall clock
  call      the same, thread CPU time
  wrapper   the OptimizedModule and the dispatcher in front of the entry (call - entry)
  entry     the generated entry function, all of it
  guards    its guard checks: the entry's own source run with the compiled call stubbed
            out, minus the same source with the guard lines removed
  compiled  the compiled graph's callable, called directly with the entry's arguments
  rest      the entry's frame, argument binding and output (entry - guards - compiled)
and the number of guards, and of checks (lines) the entry runs them in (native checks take
several guards each).
"""
from __future__ import annotations

import os
import statistics
import sys

from common import run_trees

CHILD = r"""
import json, re, sys, os
import torch
import tempa
sys.path.insert(0, sys.argv[1])
from common import interleaved_us
from seed_mlp import seed_setup

GUARD_LINE = re.compile(r"^\s+if not \(.*\): return ___MISS$")


def stubbed(entry, guards):
    # the entry's source with the compiled call replaced by its recorded output
    lines = [l for l in entry.source.splitlines() if guards or not GUARD_LINE.match(l)]
    lines = [l + "\n        pass" if l.strip() == "try:" and not guards else l for l in lines]
    ns = dict(entry.fn.__globals__)
    ns["___compiled"] = lambda *args, _out=out_of(entry): _out
    exec("\n".join(lines), ns)
    fn = ns["___entry"]
    fn.__defaults__, fn.__kwdefaults__ = entry.fn.__defaults__, entry.fn.__kwdefaults__
    return fn


def out_of(entry):
    return entry.compiled(x, *entry.captured.attr_tensors)


model, x, _eager, fast = seed_setup()
out = {"tempa": os.path.dirname(os.path.dirname(os.path.abspath(tempa.__file__)))}
for mode in ("no_grad", "grad"):
    with (torch.no_grad() if mode == "no_grad" else torch.enable_grad()):
        fast(x)
        caches = fast._tempa_context.caches.values()
        entry = next(e for c in caches for e in c.entries if e.why(model, x) is None)
        m, wall = interleaved_us({"call": (fast, (x,)), "entry": (entry.fn, (model, x)),
                                  "stubbed": (stubbed(entry, True), (model, x)),
                                  "unguarded": (stubbed(entry, False), (model, x)),
                                  "compiled": (entry.compiled, (x, *entry.captured.attr_tensors))})
        m["call_wall"] = wall["call"]
        m["guards"] = m.pop("stubbed") - m.pop("unguarded")
        m["wrapper"] = m["call"] - m["entry"]
        m["rest"] = m["entry"] - m["guards"] - m["compiled"]
        m["n_guards"] = len(entry.guards)
        m["checks"] = sum(bool(GUARD_LINE.match(l)) for l in entry.source.splitlines())
        out[mode] = m
print(json.dumps(out))
"""

COLUMNS = ("call_wall", "call", "wrapper", "entry", "guards", "compiled", "rest")


def median_of(runs: list[dict]) -> dict:
    result = {"tempa": runs[0]["tempa"]}
    for mode in ("no_grad", "grad"):
        result[mode] = {k: statistics.median(r[mode][k] for r in runs) for k in runs[0][mode]}
    return result


def main(argv: list[str]) -> None:
    runs = 3
    if "--runs" in argv:
        i = argv.index("--runs")
        runs, argv = int(argv[i + 1]), argv[:i] + argv[i + 2:]
    trees = argv or ["."]
    bench = os.path.dirname(os.path.abspath(__file__))
    # each run from an empty cache: the timed calls come after the first, compiling, one
    measured = run_trees(trees, CHILD, runs, argv=[bench], cache_per_run=True)
    results = [median_of(r) for r in measured.results]
    print(f"seed MLP, batch 8, {os.cpu_count()} cores, {runs} runs per tree (alternating), "
          "medians, µs per call")
    print(f"{'tree':28} {'mode':8} " + " ".join(f"{c:>8}" for c in COLUMNS) +
          f" {'guards':>7} {'checks':>7}")
    for r in results:
        for mode in ("no_grad", "grad"):
            m = r[mode]
            print(f"{r['tempa'][-28:]:28} {mode:8} " + " ".join(f"{m[c]:8.2f}" for c in COLUMNS) +
                  f" {int(m['n_guards']):7d} {int(m['checks']):7d}")
    if len(results) > 1:
        base = results[0]
        for r in results[1:]:
            for mode in ("no_grad", "grad"):
                ratio = r[mode]["call"] / base[mode]["call"]
                wall = r[mode]["call_wall"] / base[mode]["call_wall"]
                print(f"{r['tempa'][-28:]} vs {base['tempa'][-28:]}, {mode}: per call x{ratio:.3f} "
                      f"(thread CPU time), x{wall:.3f} (wall clock)")


if __name__ == "__main__":
    main(sys.argv[1:])
