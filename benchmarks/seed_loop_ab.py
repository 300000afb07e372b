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

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

PRIME = r"""
import sys, torch, tempa
sys.path.insert(0, {bench!r})
from seed_mlp import MLP
model, x = MLP(), torch.randn(8, 32)
fast = tempa.compile(model)
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
import copy, json, statistics, sys, time
import torch
import tempa
sys.path.insert(0, {bench!r})
from seed_mlp import MLP

torch.manual_seed(0)
model, x = MLP(), torch.randn(8, 32)
eager = copy.deepcopy(model)
fast = tempa.compile(model)
out = {{}}
for mode in ("grad", "no_grad"):
    with (torch.no_grad() if mode == "no_grad" else torch.enable_grad()):
        timed = {{"eager": eager, "tempa": fast}}
        for f in timed.values():
            for _ in range(10):
                f(x)
        cpu = {{k: [] for k in timed}}
        wall = {{k: [] for k in timed}}
        for _ in range(7):
            for name, f in timed.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(200):
                    f(x)
                cpu[name].append((time.thread_time() - c0) / 200 * 1e6)
                wall[name].append((time.perf_counter() - t0) / 200 * 1e6)
        out[mode] = {{f"{{k}}_cpu": statistics.median(v) for k, v in cpu.items()}}
        out[mode].update({{f"{{k}}_wall": statistics.median(v) for k, v in wall.items()}})
print(json.dumps(out))
"""


def _run(code: str, tree: str, cache: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), TEMPA_CACHE_DIR=cache)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=cache)
    if run.returncode:
        raise SystemExit(f"{tree}: {run.stderr.strip().splitlines()[-1:]}")
    return run.stdout


def main(argv: list[str]) -> None:
    runs = 5
    if "--runs" in argv:
        i = argv.index("--runs")
        runs, argv = int(argv[i + 1]), argv[:i] + argv[i + 2:]
    trees = argv or ["."]
    bench = os.path.dirname(os.path.abspath(__file__))
    caches = {t: tempfile.mkdtemp(prefix="tempa-seed-ab-") for t in trees}
    try:
        for t in trees:
            _run(PRIME.format(bench=bench), t, caches[t])
        results = {t: [] for t in trees}
        for _ in range(runs):
            for t in trees:
                line = _run(CHILD.format(bench=bench), t, caches[t]).strip().splitlines()[-1]
                results[t].append(json.loads(line))
    finally:
        for c in caches.values():
            shutil.rmtree(c, ignore_errors=True)
    print(f"seed MLP, seed's loop, {runs} alternating fresh processes per tree, medians, µs per "
          f"call (load average {os.getloadavg()[0]:.1f})")
    print("| tree | mode | eager cpu | tempa cpu | eager/tempa cpu | eager wall | tempa wall | "
          "eager/tempa wall |")
    print("|---|---|---|---|---|---|---|---|")
    for t in trees:
        for mode in ("grad", "no_grad"):
            rs = [r[mode] for r in results[t]]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            ratio_cpu = statistics.median(r["eager_cpu"] / r["tempa_cpu"] for r in rs)
            ratio_wall = statistics.median(r["eager_wall"] / r["tempa_wall"] for r in rs)
            print(f"| {t} | {mode} | {med['eager_cpu']:.2f} | {med['tempa_cpu']:.2f} | "
                  f"**{ratio_cpu:.2f}x** | {med['eager_wall']:.2f} | {med['tempa_wall']:.2f} | "
                  f"{ratio_wall:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
