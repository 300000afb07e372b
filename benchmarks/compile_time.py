"""Compile time of GPT-124M, broken down by phase, on this (CPU) machine.

    TRITON_INTERPRET=1 python benchmarks/compile_time.py --backend gpu --mode infer
    TRITON_INTERPRET=1 python benchmarks/compile_time.py --backend gpu --mode train
    python benchmarks/compile_time.py --backend cpu --mode train
    ... --profile out.prof     # cProfile of the first call, for pstats / snakeviz

The GPU backend runs through Triton's interpreter (TRITON_INTERPRET=1), so everything tempa
does in Python before Triton would compile kernels is measured here; Triton's own compile
(parallel worker processes on the H200) is not. The model is GPT-124M (12 layers, d=768,
vocab 50304) at a small batch and length (default 1 x 64) so that running its first call in
the interpreter stays cheap; compile time does not depend on the batch size.

Each phase's time is inclusive of what it calls; the phases listed do not nest in one
another, except that "backend" holds every phase below it and "trace training" holds the
training graph's "trace forward". "capture+run" is the first
call's time outside the backend (with --no-run: capture alone). The cache directory starts
empty (a fresh temporary directory), so nothing comes from the disk cache.

On this shared 2-core machine, run with OMP_NUM_THREADS=1 and --narrow to see tempa's own
Python time: tracing executes the graph, and oversubscribed ATen threads make that vary 5x.
"""
from __future__ import annotations

import argparse
import collections
import functools
import importlib
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

T = collections.defaultdict(float)     # phase -> seconds
N = collections.Counter()              # phase -> calls
_depth = collections.Counter()         # phase -> active calls (recursion counts once)
RENDERED = []                          # every KernelCode rendered (GPU backend)
WRITTEN = []                           # paths of the generated Triton modules


def _timed(module: str, attr: str, phase: str | None = None):
    """Wrap ``module.attr`` so that its calls add to phase ``phase`` (default: attr)."""
    mod = importlib.import_module(module)
    fn = getattr(mod, attr)
    phase = phase or attr

    @functools.wraps(fn)
    def wrapper(*a, **k):
        if _depth[phase]:
            return fn(*a, **k)
        _depth[phase] += 1
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[phase] += time.perf_counter() - t0
            N[phase] += 1
            _depth[phase] -= 1
    setattr(mod, attr, wrapper)


def instrument(backend: str):
    E = "tempa.backend.entry"
    P = "tempa.backend.pipeline"          # the passes every target shares
    _timed(E, "prepare")
    _timed(E, "trace_forward", "trace forward (decompose)")
    # training: trace_training traces its own forward (counted above too), then the joint
    _timed("tempa.backend.lower.trace", "trace_forward", "trace forward (decompose)")
    _timed(E, "trace_training", "trace training (forward + joint + partition)")
    if backend == "gpu":
        G = "tempa.backend.gpu.compile"
        _timed("tempa.backend.gpu.attention", "rewrite", "attention rewrite")
        _timed(P, "lower_graph", "lower")
        _timed(P, "eliminate_dead")
        _timed(P, "schedule")
        _timed(G, "partition")
        _timed(G, "plan_memory")
        _timed(G, "_r_contiguous")
        _timed("tempa.backend.codegen.triton", "render_kernel", "render kernels")
        tr = importlib.import_module("tempa.backend.codegen.triton")
        render = tr.render_kernel

        def keep(*a, **k):
            kc = render(*a, **k)
            RENDERED.append(kc)
            return kc
        tr.render_kernel = keep
        _timed(G, "finish", "finish (dedup, module, wrappers)")
        _timed("tempa.backend.gpu.kernels", "write_module")
        K = importlib.import_module("tempa.backend.gpu.kernels")
        write = K.write_module

        def keep_path(src):
            WRITTEN.append(write(src))
            return WRITTEN[-1]
        K.write_module = keep_path
        _timed("tempa.backend.gpu.kernels", "load_module", "load_module (exec)")
        _timed("tempa.backend.gpu.wrapper", "build", "wrapper build")
    else:
        C = "tempa.backend.compile_graph"
        _timed(P, "lower_graph", "lower")
        _timed(P, "schedule")
        _timed(C, "plan_memory")
        _timed("tempa.backend.codegen.cpp", "render_segment", "render C++")
        _timed("tempa.backend.runtime.build", "build", "gcc (build)")
        _timed("tempa.backend.codegen.wrapper", "render_wrapper", "render wrapper")
        _timed(C, "finish", "finish (gcc + wrappers)")


def gpu_only_work():
    """What ``finish`` does only on a GPU before handing kernels to Triton (signatures and
    alignment claims), timed on the kernels this run rendered."""
    from tempa.backend.gpu import kernels as K
    seen = RENDERED
    t0 = time.perf_counter()
    for kc in seen:
        K.signature(kc)
        K.aligned(kc)
    return time.perf_counter() - t0, len(seen)


class _Stop(Exception):
    """--no-run: leave the first call once the backend has compiled."""


def triton_compile(arch: int = 90):
    """Compile this run's kernels for an sm_{arch} GPU as the CUDA path would (worker
    processes fill Triton's cache, then the parent's own compile calls hit it): Triton
    compiles for a GPU target without one. Not the launchers (they need the driver).
    Returns (seconds in workers, seconds in the parent, kernel count)."""
    from triton.backends.compiler import GPUTarget
    import triton
    from tempa.backend.codegen.triton_emit import INTERPRET_SHIM
    from tempa.backend.gpu import kernels as K
    src = open(WRITTEN[-1]).read().replace(INTERPRET_SHIM, "")
    os.environ.pop("TRITON_INTERPRET", None)          # the workers compile, not interpret
    path = K.write_module(src)
    codes = {}
    for kc in RENDERED:
        codes.setdefault(kc.name, kc)
    jobs = []
    for n, kc in codes.items():
        jobs.append(K.Job(n, K.signature(kc), K.aligned(kc), kc.num_warps, getattr(kc, "num_stages", 1)))
        jobs[-1].cost = len(kc.body)           # as gpu/compile.py's finish sets it
    tgt = GPUTarget("cuda", arch, 32)
    t0 = time.perf_counter()
    K._prefill(path, jobs, tgt)
    t1 = time.perf_counter()
    mod = K.load_module(path)
    for j in jobs:
        triton.compile(K._source(mod, j), target=tgt, options={"num_warps": j.num_warps, "num_stages": j.num_stages})
    return t1 - t0, time.perf_counter() - t1, len(jobs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--mode", choices=("infer", "train"), default="infer")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--narrow", action="store_true",
                    help="the same graph at d=96, vocab 512: tracing runs the graph on real tensors, "
                         "and on this CPU that compute (a GPU's is asynchronous and negligible) would "
                         "otherwise hide tempa's own Python time")
    ap.add_argument("--autocast", action="store_true", help="bf16 CPU autocast inside forward")
    ap.add_argument("--profile", default="", help="write a cProfile of the first call here")
    ap.add_argument("--no-run", action="store_true", help="stop after compiling (skip the first run)")
    ap.add_argument("--triton", action="store_true",
                    help="then compile the kernels for an H100/H200 (sm_90) as the CUDA path would")
    a = ap.parse_args()
    if a.backend == "gpu" and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("--backend gpu on this machine needs TRITON_INTERPRET=1")
    os.environ["TEMPA_CACHE_DIR"] = tempfile.mkdtemp(prefix="tempa-ctime-")

    t_imp = time.perf_counter()
    import torch
    t_torch = time.perf_counter() - t_imp
    t_imp = time.perf_counter()
    import tempa
    if a.backend == "gpu":
        import tempa.backend.gpu.backend  # noqa: F401  (what a CUDA compile imports)
        import triton  # noqa: F401
    t_tempa = time.perf_counter() - t_imp
    from tests.models.gpt import GPT, gpt124m_config

    instrument(a.backend)
    torch.manual_seed(0)
    vocab = 512 if a.narrow else 50304
    model = GPT(gpt124m_config(n_layer=a.layers, **(dict(n_embd=96, vocab_size=vocab) if a.narrow else {})))
    model.train(a.mode == "train")
    if a.autocast:
        from benchmarks.gpu import Autocast
        model = Autocast(model, "cpu")
    idx = torch.randint(0, vocab, (a.batch, a.seq))
    targets = torch.randint(0, vocab, (a.batch, a.seq))

    backend_s = [0.0]
    if a.backend == "gpu":
        from tempa.backend.gpu import gpu_backend
        inner = gpu_backend
    else:
        from tempa.backend.entry import tempa_backend
        inner = tempa_backend

    def backend(gm, ex):
        t0 = time.perf_counter()
        try:
            fn = inner(gm, ex)
        finally:
            backend_s[0] += time.perf_counter() - t0
        if a.no_run:
            raise _Stop
        return fn
    backend.supports_dynamic = True
    tempa.config.raise_on_failure = True
    compiled = tempa.compile(model, backend=backend)

    prof = None
    if a.profile:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    try:
        if a.mode == "infer":
            with torch.no_grad():
                compiled(idx)
        else:
            logits, loss = compiled(idx, targets)     # as benchmarks/gpu.py's training step
            loss.backward()                           # (its graph compiled with the forward)
    except _Stop:
        pass
    total = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
        prof.dump_stats(a.profile)

    print(f"GPT-124M{' graph at d=96, vocab 512' if a.narrow else ''} {a.layers} layers, batch {a.batch} x T={a.seq}, {a.mode}, backend {a.backend}"
          f"{' (Triton interpreter)' if a.backend == 'gpu' else ''}{', bf16 autocast' if a.autocast else ''}")
    print(f"  import torch {t_torch:6.2f} s, import tempa{' + gpu + triton' if a.backend == 'gpu' else ''} "
          f"{t_tempa:6.2f} s")
    print(f"  first call total {total:7.2f} s   backend {backend_s[0]:6.2f} s   "
          f"capture+run {total - backend_s[0]:6.2f} s")
    for phase, s in T.items():
        print(f"    {phase:36s} {s:7.3f} s  ({N[phase]} calls)")
    if a.backend == "gpu":
        s, n = gpu_only_work()
        print(f"    {'signatures+alignment (GPU only)':36s} {s:7.3f} s  ({n} kernels)")
    if a.backend == "gpu" and a.triton:
        w, p, n = triton_compile()
        print(f"  Triton compile for sm_90 ({n} kernels, {os.cpu_count()} cores): workers {w:6.2f} s, "
              f"parent (cache hits) {p:6.2f} s")
    print(f"  stats: {tempa.stats()}")
    print(f"  torch._dynamo imported: {'torch._dynamo' in sys.modules}")


if __name__ == "__main__":
    main()
