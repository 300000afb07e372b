"""Where a zoo model's compiled call spends its time, under one or more source trees.

    python benchmarks/percall_breakdown.py BEFORE AFTER --only dropout_eval,hf_bert [--runs 2]

For each model (tests/models/zoo.py), each tree in alternating fresh processes
(``common.run_trees``), µs per call by thread CPU time, interleaved (``common.interleaved_us``):
  eager       the model itself
  fast        the compiled module, as the user calls it
  tempa_call  the same past OptimizedModule.__call__ (the dispatcher and the entry)
  entry       the top entry function alone (guards, compiled call, rebuilt result)
  stubbed     that entry with its compiled call replaced by the call's recorded output:
              its guards and the rebuilding of the result
  compiled    the compiled callable alone, on the arguments the entry passes
so ``fast - tempa_call`` is the wrapper, ``tempa_call - entry`` the dispatcher, ``stubbed``
the guards' share. Training cases time forward and backward of the output's sum (then
``stubbed`` and ``compiled`` are only indicative). The medians over a tree's runs are shown.
"""
from __future__ import annotations

import argparse
import os
import statistics

from common import run_trees

CHILD = r"""
import copy, functools, json, re, sys, time, warnings
warnings.filterwarnings("ignore")
tree, bench, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
sys.path.insert(0, tree)
import torch
import tempa
sys.path.append(bench)
sys.path.append(tree)
from common import interleaved_us
from tests.models import zoo
from hf_models import first_tensor
torch.set_num_threads(1)
GUARD_LINE = re.compile(r"^\s+if not \(.*\): return ___MISS$")
out = {}
for name in names:
    torch.manual_seed(0)
    case = zoo.make(name)
    eager_model = copy.deepcopy(case.model)
    with (torch.enable_grad() if case.train else torch.no_grad()):
        fast = tempa.compile(copy.deepcopy(case.model))
        a, k = case.args, case.kwargs

        def run(fn):
            if case.train:
                return lambda: first_tensor(fn(*a, **k)).float().sum().backward()
            return lambda: fn(*a, **k)
        for _ in range(5):
            run(fast)()
        call = fast.__dict__["_tempa_call"]
        entry = call.func.__tempa_cache__.entries[0]
        mod = fast._orig_mod
        seen = {}

        def recording(*xs, _compiled=entry.compiled):
            seen["args"], seen["out"] = xs, _compiled(*xs)
            return seen["out"]

        def with_compiled(fn):
            ns = dict(entry.fn.__globals__, ___compiled=fn)
            exec(entry.source, ns)
            f = ns["___entry"]
            f.__defaults__, f.__kwdefaults__ = entry.fn.__defaults__, entry.fn.__kwdefaults__
            return functools.partial(f, mod)
        with_compiled(recording)(*a, **k)
        stub = with_compiled(lambda *xs, _out=seen["out"]: _out)
        timed = {"eager": (run(eager_model), ()), "fast": (run(fast), ()),
                 "tempa_call": (run(call), ()), "entry": (run(functools.partial(entry.fn, mod)), ()),
                 "stubbed": (run(stub), ()),
                 "compiled": (lambda: entry.compiled(*seen["args"]), ())}
        cpu, _ = interleaved_us(timed, calls=50 if case.train or name.startswith("hf") else 300)
        cpu["guards"] = len(entry.guards)
        cpu["checks"] = sum(bool(GUARD_LINE.match(line)) for line in entry.source.splitlines())
        out[name] = cpu
print(json.dumps(out))
"""

COLUMNS = ("eager", "fast", "tempa_call", "entry", "stubbed", "compiled", "guards", "checks")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--only", required=True)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    bench = os.path.dirname(os.path.abspath(__file__))
    trees = [os.path.abspath(t) for t in a.trees]
    measured = run_trees(trees, CHILD, a.runs, argv=lambda run, k: [trees[k], bench, a.only])
    print(f"µs per call, thread CPU time, medians of {a.runs} runs per tree (alternating); "
          f"load average {measured.load_start:.1f} -> {measured.load_end:.1f}")
    print(f"| model | tree | {' | '.join(COLUMNS)} |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for name in a.only.split(","):
        for tree, runs in zip(trees, measured.results):
            row = [statistics.median(r[name][c] for r in runs) for c in COLUMNS]
            print(f"| {name} | {os.path.basename(tree)} | " +
                  " | ".join(f"{v:.0f}" if c in ("guards", "checks") else f"{v:.2f}"
                             for c, v in zip(COLUMNS, row)) + " |")


if __name__ == "__main__":
    main()
