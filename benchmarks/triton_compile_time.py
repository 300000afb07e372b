"""Triton compile time of each GPT-124M kernel for an H100/H200 (sm_90), on a machine without a GPU.

    python benchmarks/triton_compile_time.py [--mode train|infer] [--vocab 50304] [--top 12]

Why: on the GPU, kernels compile in parallel worker processes, so the slowest kernel is the
critical path of the first call's compile. Triton compiles to sm_90 without a GPU (ptxas
comes with its wheel), so the kernels can be timed here: the graph is traced and rendered
through Triton's interpreter (as the interpreter tests do), the kernel jobs the GPU backend
would hand its workers are written to a file, and a second process without the interpreter
compiles each one for sm_90 and reports the slowest. Times are this machine's, one kernel at
a time; the H200 host compiles 16 at once.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class _Collected(Exception):
    """Raised once the jobs are written: nothing needs to run."""


def collect(mode: str, vocab: int, jobs_file: str) -> None:
    """Trace and render the model through the interpreter; write the kernel jobs the GPU
    backend would compile."""
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.setdefault("TEMPA_CACHE_DIR", tempfile.mkdtemp())
    import torch
    import tempa
    from benchmarks.gpu import Autocast
    from tempa.backend.gpu import compile as gc
    from tempa.backend.gpu import kernels
    from tests.backend.test_gpu import _interp_backend
    from tests.models import gpt as G
    tempa.config.raise_on_failure = True
    finish = gc.finish

    def finish_for_sm90(plans):
        kernels.interpret_mode = lambda: False       # build the jobs as for a GPU
        return finish(plans)

    def write_jobs(path, jobs, parallel_min=3):
        with open(jobs_file, "w") as f:
            json.dump({"path": path, "jobs": [dict(j.as_json(), cost=j.cost) for j in jobs]}, f)
        raise _Collected()
    gc.finish = finish_for_sm90
    kernels.compile_jobs = write_jobs
    cfg = G.gpt124m_config(vocab_size=vocab)
    torch.manual_seed(0)
    model = Autocast(G.GPT(cfg), "cpu")
    idx = torch.randint(0, vocab, (1, 64))
    compiled = tempa.compile(model, backend=_interp_backend())
    try:
        if mode == "train":
            model.train()
            compiled(idx, idx)[1].backward()
        else:
            model.eval()
            with torch.no_grad():
                compiled(idx)
    except _Collected:
        pass


def compile_all(jobs_file: str) -> list:
    """(seconds, name, source chars, pointer args, warps, error) per job, compiled for sm_90."""
    from triton.backends.compiler import GPUTarget
    from tempa.backend.gpu import kernels
    with open(jobs_file) as f:
        spec = json.load(f)
    mod = kernels.load_module(spec["path"])
    target = GPUTarget("cuda", 90, 32)
    out = []
    for j in spec["jobs"]:
        job = kernels.Job(j["name"], j["signature"], j["aligned"], j["num_warps"], j["num_stages"])
        t0 = time.perf_counter()
        try:
            kernels._compile(mod, job, target)
            err = ""
        except Exception as e:  # noqa: BLE001 - reported in the table
            err = f"{type(e).__name__}: {str(e)[:80]}"
        pointers = sum(1 for t in j["signature"].values() if str(t).startswith("*"))
        out.append((time.perf_counter() - t0, j["name"], j["cost"], pointers, j["num_warps"], err))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["train", "infer"], default="train")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--compile-only", default="", help=argparse.SUPPRESS)   # the child process
    a = ap.parse_args()
    if a.compile_only:
        print(json.dumps(compile_all(a.compile_only)))
        return
    jobs_file = os.path.join(tempfile.mkdtemp(), "jobs.json")
    collect(a.mode, a.vocab, jobs_file)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp()     # every kernel compiled, none from a cache
    child = subprocess.run([sys.executable, __file__, "--compile-only", jobs_file], env=env,
                           capture_output=True, text=True)
    if child.returncode != 0:
        sys.exit(child.stderr[-2000:])
    rows = sorted(json.loads(child.stdout.splitlines()[-1]), reverse=True)
    total = sum(r[0] for r in rows)
    print(f"GPT-124M {a.mode}, vocab {a.vocab}: {len(rows)} kernels, {total:.2f} s compiling one at a time "
          f"for sm_90; slowest {rows[0][0]:.2f} s ({rows[0][0] / total:.0%})")
    print(f"{'seconds':>8s}  {'kernel':12s} {'source':>7s} {'pointers':>8s} {'warps':>5s}")
    for sec, name, chars, ptrs, warps, err in rows[:a.top]:
        print(f"{sec:8.2f}  {name:12s} {chars:7d} {ptrs:8d} {warps:5d} {err}")


if __name__ == "__main__":
    main()
