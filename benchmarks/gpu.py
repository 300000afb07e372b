"""GPU benchmark: eager vs torch.compile vs tempa, each mode, on the issue's models, one process.

    python benchmarks/gpu.py                 # everything (needs CUDA; ~5 minutes on an H200)
    python benchmarks/gpu.py --only tempa    # skip torch.compile (faster iteration)
    python benchmarks/gpu.py --rows mlp,gpt_b1 --json out.json

Rows: the seed MLP (fp32, batch 8, inference); GPT 124M bf16 autocast inference at batch 8 x
T=1024 and batch 1 x T=64; one GPT training step (forward, backward, SGD) at batch 8 x 1024.
Times are medians of per-call CUDA-event timings after warm-up; "compile" is the first call's
wall time (capture + compile + first run). tempa's cache starts empty (a fresh directory), so
its first mode on each model is a cold compile; later modes reuse cached kernels, as
torch.compile's later modes reuse its caches. Each cell also checks the result against
eager (max relative error of the output) and prints it.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


class Autocast(nn.Module):
    """bf16 autocast inside forward: tempa captures the autocast region in the graph."""

    def __init__(self, m, device_type="cuda"):
        super().__init__()
        self.m = m
        self.device_type = device_type

    def forward(self, *a):
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            return self.m(*a)


def median_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def rel_err(a, b):
    if isinstance(a, (tuple, list)):
        a, b = a[0], b[0]
    a, b = a.float(), b.float()
    return ((a - b).norm() / (b.norm() + 1e-12)).item()


def make_rows(names):
    from tests.models.gpt import GPT, gpt124m_config
    rows = {}
    if "mlp" in names:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda().eval()
        rows["mlp"] = dict(title="seed MLP fp32 b8 inference", model=m, args=(torch.randn(8, 32, device="cuda"),),
                           train=False, reps=200)
    for key, B, T in (("gpt_b8", 8, 1024), ("gpt_b1", 1, 64)):
        if key in names:
            torch.manual_seed(0)
            m = Autocast(GPT(gpt124m_config()).cuda().eval())
            idx = torch.randint(0, 50304, (B, T), device="cuda")
            rows[key] = dict(title=f"GPT-124M bf16 b{B} T{T} inference", model=m, args=(idx,), train=False,
                             reps=30 if B == 8 else 100)
    if "gpt_train" in names:
        torch.manual_seed(0)
        m = Autocast(GPT(gpt124m_config()).cuda().train())
        idx = torch.randint(0, 50304, (8, 1024), device="cuda")
        tgt = torch.randint(0, 50304, (8, 1024), device="cuda")
        rows["gpt_train"] = dict(title="GPT-124M bf16 b8 T1024 train step", model=m, args=(idx, tgt), train=True,
                                 reps=15)
    return rows


def run_cell(row, system, mode, log):
    import tempa
    model = copy.deepcopy(row["model"])
    args = row["args"]
    if system == "eager":
        fn = model
    elif system == "torch.compile":
        import importlib
        importlib.import_module("torch._dynamo").reset()
        fn = torch.compile(model, mode=mode)
    else:
        tempa.reset() if hasattr(tempa, "reset") else None
        fn = tempa.compile(model, mode=mode)
    if row["train"]:
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)

        def step():
            logits, loss = fn(*args)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        call = step
    else:
        def call():
            with torch.no_grad():
                return fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = call()
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    # keep a copy: CUDA-graph outputs are overwritten by later calls (torch.compile raises
    # when an overwritten output is read)
    out = tuple(o.detach().clone() for o in out) if isinstance(out, tuple) else out.detach().clone()
    for x in w:
        log.write(f"  warning [{system} {mode}]: {x.message}\n")
    ms = median_ms(call, reps=row["reps"])
    # host time per call: launches queue asynchronously, so this is the Python/launch cost
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    for _ in range(10):
        call()
    host_us = (time.perf_counter() - t1) / 10 * 1e6
    torch.cuda.synchronize()
    notes = ""
    if system == "tempa":
        try:
            infos = [e.compiled.tempa_info for e in tempa.entries(fn) if hasattr(e.compiled, "tempa_info")]
            for inf in infos:
                gi = inf.inference or inf.forward
                log.write(f"  tempa {mode}: {inf}; {gi.summary() if gi else ''}; notes={inf.notes}\n")
                if gi is not None and os.environ.get("TEMPA_BENCH_DUMP"):
                    log.write(gi.fusion_report + "\n")
            notes = f"{sum(len(getattr(i.inference or i.forward, 'kernels', [])) for i in infos)} launches"
            guards = [getattr(e.compiled, "__closure__", None) for e in tempa.entries(fn)]
            del guards
        except Exception as e:  # noqa: BLE001
            notes = f"(info: {e})"
    return ms, compile_s, out, f"host {host_us:.0f} us/call; " + notes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="mlp,gpt_b1,gpt_b8,gpt_train")
    ap.add_argument("--only", default="", help="'tempa' to skip torch.compile")
    ap.add_argument("--json", default="")
    ap.add_argument("--log", default="")
    a = ap.parse_args()
    os.environ.setdefault("TEMPA_CACHE_DIR", tempfile.mkdtemp(prefix="tempa-bench-"))
    import tempa
    tempa.config.cache_dir = os.environ["TEMPA_CACHE_DIR"]
    log = open(a.log, "w") if a.log else sys.stderr
    names = a.rows.split(",")
    rows = make_rows(names)
    plan = {
        "mlp": [("eager", None), ("torch.compile", None), ("torch.compile", "reduce-overhead"),
                ("torch.compile", "max-autotune"), ("tempa", None), ("tempa", "reduce-overhead"),
                ("tempa", "max-autotune")],
        "gpt_b8": [("eager", None), ("torch.compile", None), ("torch.compile", "reduce-overhead"),
                   ("tempa", None), ("tempa", "reduce-overhead")],
        "gpt_b1": [("eager", None), ("torch.compile", None), ("torch.compile", "reduce-overhead"),
                   ("tempa", None), ("tempa", "reduce-overhead")],
        "gpt_train": [("eager", None), ("torch.compile", None), ("tempa", None), ("tempa", "reduce-overhead")],
    }
    results = []
    for key, row in rows.items():
        ref = None
        for system, mode in plan[key]:
            if a.only == "tempa" and system == "torch.compile":
                continue
            try:
                ms, cs, out, notes = run_cell(row, system, mode, log)
                if system == "eager":
                    ref = out
                err = rel_err(out, ref) if ref is not None and not row["train"] else float("nan")
                if row["train"] and ref is not None:
                    err = abs(out.item() - ref.item()) / abs(ref.item())
                r = dict(row=key, system=system, mode=mode or "default", ms=ms, compile_s=cs, err=err, notes=notes)
            except Exception as e:  # noqa: BLE001
                import traceback
                log.write(traceback.format_exc())
                r = dict(row=key, system=system, mode=mode or "default", ms=float("nan"), compile_s=float("nan"),
                         err=float("nan"), notes=f"FAILED {type(e).__name__}: {str(e)[:120]}")
            results.append(r)
            # one line per cell as it finishes, so a run cut short still reports what it measured
            print(f"  {r['row']:10s} {r['system']:14s} {r['mode']:16s} {r['ms']:9.3f} ms  compile {r['compile_s']:6.2f} s"
                  f"  err {r['err']:.1e}  {r['notes']}", flush=True)
            log.write(json.dumps(r) + "\n")
            log.flush()
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(results=results, torch=torch.__version__, gpu=torch.cuda.get_device_name(),
                           date=time.strftime("%Y-%m-%d")), f, indent=1)
    print(f"\n{'row':10s} {'system':14s} {'mode':16s} {'ms':>9s} {'compile s':>10s} {'rel err':>9s}  notes")
    for r in results:
        print(f"{r['row']:10s} {r['system']:14s} {r['mode']:16s} {r['ms']:9.3f} {r['compile_s']:10.2f} "
              f"{r['err']:9.1e}  {r['notes']}")


if __name__ == "__main__":
    main()
