"""Where a gpu_real.py cell's time goes (issue 19): per row and system, the call's median
(CUDA events, as gpu_real.py), the host's time to issue one call (no synchronisation: when
it is near the median, the call is bound by the CPU), for reduce-overhead the replay of the
recorded CUDA graph alone, a cProfile of tempa's calls and a torch.profiler table.

    python benchmarks/gpu_profile.py --rows resnet50_tv,bert --outdir DIR
                                     [--systems tempa:reduce-overhead,torch.compile:default]

Writes DIR/<row>.txt (every table) and prints a summary line per cell. Without a GPU it stops
after parsing its arguments (gpu_real.py --device cpu is the CPU smoke test of the rows).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import gpu_real  # noqa: E402

DEFAULT_SYSTEMS = "tempa:default,tempa:reduce-overhead,torch.compile:default,torch.compile:reduce-overhead"


def host_issue_ms(call, reps=20):
    """Median host time of one call, not waiting for the GPU (synchronised between calls)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def graph_replay_ms(model):
    """Median time of replaying tempa's recorded CUDA graphs alone (no guards, no copies)."""
    import tempa
    graphs = []
    for e in tempa.entries(model):
        runners = [getattr(e.compiled, "tempa_cudagraphs", None)]
        # a training graph's forward and backward runners (runtime/cudagraphs.py)
        info = getattr(e.compiled, "tempa_info", None)
        runners += list(getattr(info, "training_cudagraphs", None) or ())
        for runner in runners:
            if runner is not None:
                graphs += [r.graph for r in runner.recs.values() if r.graph is not None]
    if not graphs:
        return float("nan"), 0

    def replay():
        for g in graphs:
            g.replay()
    return gpu_real.median_call_ms(replay, warmup=3, reps=20), len(graphs)


def write_code(model, path):
    """Every compiled part's schedule, fusion report, Triton source and wrapper, to ``path``:
    the kernel names of the profiler's tables (k12_pw, k40_red) are defined there."""
    import tempa
    with open(path, "w") as out:
        for i, e in enumerate(tempa.entries(model)):
            info = getattr(e.compiled, "tempa_info", None)
            for part in ("forward", "backward", "inference"):
                p = getattr(info, part, None)
                if p is None:
                    continue
                out.write(f"######## entry {i} {part}\n")
                for name in ("schedule",):
                    out.write(f"---- {name}\n{p.passes.get(name, '')}\n")
                out.write(f"---- fusion\n{getattr(p, 'fusion_report', '')}\n")
                out.write(f"---- wrapper\n{getattr(p, 'wrapper_source', '')}\n")
                out.write(f"---- triton\n{getattr(p, 'triton_source', '')}\n")


def profile_cell(row, system, mode, report, code_dir=None):
    call = row.cell(gpu_real.compiler(system, mode))
    call()
    torch.cuda.synchronize()
    ms = gpu_real.median_call_ms(call, warmup=5, reps=row.reps)
    host = host_issue_ms(call)
    line = f"{row.key} {system} {mode}: {ms:.3f} ms, host issue {host:.3f} ms"
    if system == "tempa":
        # the compiled module the row's call closes over
        model = next((c.cell_contents for c in call.__closure__ or ()
                      if "_tempa_context" in getattr(c.cell_contents, "__dict__", {})), None)
        if model is not None and mode == "reduce-overhead":
            gms, n = graph_replay_ms(model)
            line += f", {n} CUDA graph(s) replay alone {gms:.3f} ms"
        if model is not None and code_dir:
            write_code(model, os.path.join(code_dir, f"{row.key}-{mode}-code.txt"))
        if model is not None:
            import tempa
            for e in tempa.entries(model):
                info = getattr(e.compiled, "tempa_info", None)
                if info is not None:
                    report.write(f"-- {system} {mode} entry notes: {getattr(info, 'notes', None)}\n")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            call()
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        report.write(f"== cProfile, 10 calls: {line}\n{s.getvalue()}\n")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    ka = p.key_averages()
    report.write(f"== torch.profiler, 5 calls, by device time: {line}\n")
    report.write(ka.table(sort_by="self_cuda_time_total", row_limit=30) + "\n")
    report.write(f"== torch.profiler, 5 calls, by host time: {line}\n")
    report.write(ka.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")
    print(line, flush=True)
    report.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="resnet50_tv,bert")
    ap.add_argument("--systems", default=DEFAULT_SYSTEMS, help="system:mode,... (gpu_real.py's)")
    ap.add_argument("--outdir", default=".")
    ap.add_argument("--code", action="store_true",
                    help="also write tempa's schedules, kernels and wrappers to DIR/<row>-<mode>-code.txt")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_profile.py needs CUDA")
    import tempa
    os.environ.setdefault("TEMPA_CACHE_DIR", tempfile.mkdtemp(prefix="tempa-gpu-profile-"))
    tempa.config.cache_dir = os.environ["TEMPA_CACHE_DIR"]
    warnings.filterwarnings("ignore")
    if gpu_real.hf_models.available():
        import transformers
        transformers.logging.set_verbosity_error()
    systems = [s.split(":") for s in a.systems.split(",")]
    for key in a.rows.split(","):
        row = gpu_real.make_row(key)
        if isinstance(row, str):
            print(f"{key}: skipped: {row}")
            continue
        with open(os.path.join(a.outdir, f"{key}.txt"), "w") as report:
            for system, mode in systems:
                try:
                    profile_cell(row, system, mode, report, a.outdir if a.code else None)
                except Exception as e:  # noqa: BLE001 - one cell failing must not end the run
                    traceback.print_exc()
                    print(f"{key} {system} {mode}: FAILED {type(e).__name__}: {e}", flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
