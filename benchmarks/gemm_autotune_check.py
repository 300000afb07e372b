"""mode="max-autotune" on the GPU: GEMM templates with fused epilogues vs cuBLAS, and the cache.

    python benchmarks/gemm_autotune_check.py            # needs CUDA + Triton; ~1-2 minutes on an H200
    python benchmarks/gemm_autotune_check.py --cache DIR --rows gpt_fc,mlp_fp32

Runs the cases below twice, each time in a fresh process sharing one (new, empty) tempa
cache directory:

  1st process  compiles every case in the default mode and in max-autotune (which tunes each
               GEMM site: template configurations vs cuBLAS + the separate epilogue kernel),
               checks the results against eager, prints the tuning choices and the times
  2nd process  the same; it must find every tuning decision on disk ("disk cache") and
               benchmark nothing, and give the same results

Per case: max relative error vs eager (and vs an fp64 reference), median ms per call (CUDA
events, after warm-up) of eager, tempa default, tempa max-autotune, and the first call's wall
time (compile). Exit status 1 if a result is wrong or the second process tuned again.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ROWS = ["gpt_fc", "gpt_proj", "mlp_fp32", "attn_bmm", "seed_mlp"]


def make_case(name):
    """(module or function, inputs, tolerance vs eager)."""
    import torch
    import torch.nn as nn
    from benchmarks.gpu import Autocast      # bf16 autocast inside forward, as in gpu.py
    torch.manual_seed(0)
    dev = "cuda"

    class ProjResidual(nn.Module):      # GPT-2 124M attention/MLP output projection + residual
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3072, 768)

        def forward(self, h, res):
            return res + self.proj(h)

    if name == "gpt_fc":                # GPT-2 124M MLP up-projection, batch 8 x T=1024, bf16 autocast
        m = Autocast(nn.Sequential(nn.Linear(768, 3072), nn.GELU(approximate="tanh"))).to(dev).eval()
        return m, (torch.randn(8192, 768, device=dev),), 3e-2
    if name == "gpt_proj":
        m = ProjResidual().to(dev).to(torch.bfloat16).eval()
        return m, (torch.randn(8192, 3072, device=dev, dtype=torch.bfloat16),
                   torch.randn(8192, 768, device=dev, dtype=torch.bfloat16)), 3e-2
    if name == "mlp_fp32":              # a wide fp32 MLP (the seed MLP's structure, scaled up)
        m = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(dev).eval()
        return m, (torch.randn(4096, 1024, device=dev),), 1e-3
    if name == "attn_bmm":              # attention scores, 12 heads x batch 8, T=1024, d=64, bf16
        def scores(q, k):
            return torch.bmm(q, k.transpose(1, 2)) * 0.125
        return scores, (torch.randn(96, 1024, 64, device=dev, dtype=torch.bfloat16),
                        torch.randn(96, 1024, 64, device=dev, dtype=torch.bfloat16)), 3e-2
    if name == "seed_mlp":              # the seed MLP itself: its matmuls are inlined, nothing to tune
        m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev).eval()
        return m, (torch.randn(8, 32, device=dev),), 1e-4
    raise KeyError(name)


def cuda_ms(fn, args, iters=50):
    from benchmarks.gpu import median_ms      # CUDA events, warm-up, median
    return median_ms(lambda: fn(*args), warmup=3, reps=iters)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / (b.norm() + 1e-30)).item()


def child(rows):
    import torch
    import tempa
    results = []
    for name in rows:
        fn, args, tol = make_case(name)
        with torch.no_grad():
            ref = fn(*args)
            row = {"case": name, "tol": tol, "eager_ms": cuda_ms(fn, args)}
            try:
                import copy
                fn64 = copy.deepcopy(fn).double() if isinstance(fn, torch.nn.Module) else fn
                ref64 = fn64(*[a.double() for a in args]) if name != "gpt_fc" else None
            except Exception:  # noqa: BLE001 - autocast cases have no fp64 twin
                ref64 = None
            for mode in ("default", "max-autotune"):
                compiled = tempa.compile(fn, mode=mode)
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out = compiled(*args)
                    torch.cuda.synchronize()
                    row[f"{mode}_compile_s"] = round(time.perf_counter() - t0, 2)
                    out = compiled(*args)          # max-autotune: replays the CUDA graph
                    row[f"{mode}_ms"] = cuda_ms(compiled, args)
                row[f"{mode}_err_vs_eager"] = rel_err(out, ref)
                if ref64 is not None:
                    row[f"{mode}_err_vs_fp64"] = rel_err(out, ref64)
                infos = [e.compiled.tempa_info for e in tempa.entries(compiled)]
                g = infos[0].inference if infos and infos[0].inference is not None else None
                if mode == "max-autotune":
                    row["autotune"] = list(g.autotune) if g is not None else []
                    row["launches"] = g.fusion_report.split("not fused")[0].strip() if g is not None else ""
                if ref64 is not None:
                    row["eager_err_vs_fp64"] = rel_err(ref, ref64)
        row["ok"] = all(row[f"{m}_err_vs_eager"] <= tol for m in ("default", "max-autotune"))
        results.append(row)
        print("ROW " + json.dumps(row), flush=True)
        del fn, args, ref
        torch.cuda.empty_cache()


def run_child(cache, rows):
    env = dict(os.environ, TEMPA_CACHE_DIR=cache)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--rows", ",".join(rows)],
                       env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rows_out = [json.loads(line[4:]) for line in p.stdout.splitlines() if line.startswith("ROW ")]
    if p.returncode != 0:
        print(p.stdout[-4000:])
        print(p.stderr[-6000:])
    return rows_out, wall, p.returncode


def report(label, rows, wall):
    print(f"\n== {label} ({wall:.1f} s) ==")
    print(f"{'case':<10} {'eager ms':>9} {'default ms':>10} {'autotune ms':>11} {'speedup':>8} "
          f"{'compile s (def/at)':>18} {'err vs eager (at)':>18}  ok")
    for r in rows:
        sp = r["default_ms"] / r["max-autotune_ms"] if r["max-autotune_ms"] else float("nan")
        print(f"{r['case']:<10} {r['eager_ms']:9.4f} {r['default_ms']:10.4f} {r['max-autotune_ms']:11.4f} "
              f"{sp:7.2f}x {r['default_compile_s']:8.2f}/{r['max-autotune_compile_s']:<8.2f} "
              f"{r['max-autotune_err_vs_eager']:18.2e}  {'yes' if r['ok'] else 'NO'}")
        for line in r.get("autotune", []):
            print(f"    autotune: {line}")
        if "eager_err_vs_fp64" in r:
            print(f"    vs fp64: eager {r['eager_err_vs_fp64']:.2e}, default {r['default_err_vs_fp64']:.2e}, "
                  f"max-autotune {r['max-autotune_err_vs_fp64']:.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--cache", default=None, help="tempa cache dir (default: a new temporary one)")
    ap.add_argument("--launches", action="store_true", help="print each case's max-autotune launches")
    a = ap.parse_args()
    rows = [r for r in a.rows.split(",") if r]
    if a.child:
        child(rows)
        return 0
    cache = a.cache or tempfile.mkdtemp(prefix="tempa-gemm-check-")
    print(f"cache: {cache}")
    first, w1, rc1 = run_child(cache, rows)
    report("first process (tunes)", first, w1)
    second, w2, rc2 = run_child(cache, rows)
    report("second process (must reuse the tuning cache)", second, w2)
    if a.launches:
        for r in first:
            print(f"\n{r['case']}:\n{r.get('launches', '')}")
    bad = []
    if rc1 or rc2 or len(first) != len(rows) or len(second) != len(rows):
        bad.append("a child process failed")
    bad += [f"{r['case']}: wrong result" for r in first + second if not r["ok"]]
    retuned = [f"{r['case']}: {line}" for r in second for line in r.get("autotune", []) if "benchmarked" in line]
    bad += [f"second process tuned again: {x}" for x in retuned]
    entries = sum(len(fs) for _, _, fs in os.walk(os.path.join(cache, "autotune")))
    print(f"\nautotune entries on disk: {entries // 2}")
    print("OK" if not bad else "FAILED:\n  " + "\n  ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
