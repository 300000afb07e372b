"""What guards cost: the seed MLP's per-call time compiled, and the guard checks' own time.

The guard time is that of the entry's ``why`` function: the same guard expressions as the
entry, run to the end (it returns None when all pass), without the compiled call. Each
source tree runs in its own fresh process with ``PYTHONPATH`` set to it, so one run
compares two versions of tempa side by side (same machine, same moment):

    python benchmarks/guard_cost.py /work/main .        # before / after
    python benchmarks/guard_cost.py                      # this tree only

Timing follows benchmarks/common.py: warm-up, 200 calls a round, median of 7 rounds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, os
import torch
import tempa
sys.path.insert(0, os.path.join({bench!r}))
from common import per_call_us
from seed_mlp import MLP

torch.manual_seed(0)
model, x = MLP(), torch.randn(8, 32)
fast = tempa.compile(model)
out = {{"tempa": os.path.dirname(os.path.dirname(os.path.abspath(tempa.__file__)))}}
for mode in ("no_grad", "grad"):
    with (torch.no_grad() if mode == "no_grad" else torch.enable_grad()):
        fast(x)
        caches = fast._tempa_context.caches.values()
        entry = next(e for c in caches for e in c.entries if e.why(model, x) is None)
        out[mode] = {{"call_us": per_call_us(fast, x, calls=200, rounds=7),
                     "guards_us": per_call_us(entry.why, model, x, calls=200, rounds=7),
                     "guards": len(entry.guards)}}
print(json.dumps(out))
"""


def measure(tree: str) -> dict:
    bench = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), TEMPA_CACHE_DIR=cache)
        run = subprocess.run([sys.executable, "-c", CHILD.format(bench=bench)], env=env,
                             capture_output=True, text=True, cwd=cache)
    if run.returncode:
        raise SystemExit(f"{tree}: {run.stderr.strip().splitlines()[-1:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(trees: list[str]) -> None:
    results = [measure(t) for t in trees or ["."]]
    print(f"seed MLP, batch 8, {os.cpu_count()} cores: per-call time compiled, and the guards' own")
    print(f"{'tree':28} {'mode':8} {'call us':>8} {'guards us':>10} {'guards':>7}")
    for r in results:
        for mode in ("no_grad", "grad"):
            m = r[mode]
            print(f"{r['tempa'][-28:]:28} {mode:8} {m['call_us']:8.2f} {m['guards_us']:10.2f} "
                  f"{m['guards']:7d}")
    if len(results) > 1:
        base = results[0]
        for r in results[1:]:
            for mode in ("no_grad", "grad"):
                ratio = r[mode]["call_us"] / base[mode]["call_us"]
                print(f"{r['tempa'][-28:]} vs {base['tempa'][-28:]}, {mode}: per call x{ratio:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
