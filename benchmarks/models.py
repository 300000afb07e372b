"""The zoo's models on CPU (fp32, small batch): eager vs tempa vs torch.compile.

    python benchmarks/models.py [--only NAME[,NAME...]] [--no-torch-compile] [--rounds N]
                                [--threads N] [--clock wall|cpu] [--profile]

For each case of tests/models/zoo.py (all but the graph-break seed, which breaks.py
measures): the first call of each compiler is timed (its compile time; tempa starts from an
empty cache directory, so gcc runs), then eager, tempa and torch.compile are timed
interleaved round by round (so load from other jobs hits all three alike), medians of
per-call times after warm-up. Inference cases run under no_grad; training cases
(``case.train``) time forward + backward of the output's sum. Speedups are eager time /
compiled time (above 1: faster than eager); the geomean is over the models where both ran.
Prints a Markdown table (paste into README.md under "## CPU models").

``--profile``: instead of the comparison, time each statement of tempa's generated wrappers
(C++ segment calls, extern ATen calls, fallbacks, allocations; benchmarks/segments.py) and
print where a call's time goes, per model.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from tests.models import zoo  # noqa: E402
from hf_models import first_tensor  # noqa: E402


def runner(fn, case):
    args, kwargs = case.args, case.kwargs
    if case.train:
        def run():
            out = first_tensor(fn(*args, **kwargs))
            out.float().sum().backward()
    else:
        def run():
            fn(*args, **kwargs)
    return run


# Which clock times the calls: wall time (default), or this thread's CPU time (``--clock
# cpu``), which does not count the time other jobs hold the cores. Use ``cpu`` with
# ``--threads 1`` on a loaded machine: all the work then runs on the calling thread (tempa's
# kernels stay serial at these sizes), so CPU time is the time the call would take alone.
CLOCK = time.perf_counter


def timed_once(run, clock=None):
    clock = clock or CLOCK
    t0 = clock()
    run()
    return clock() - t0


def interleaved(runs: dict, rounds: int, target_s=0.05):
    """Per-call µs of each runner: warm-up, then ``rounds`` rounds, each timing a loop of n
    calls of every runner in turn (n sized so a loop takes ~target_s); medians."""
    for r in runs.values():
        for _ in range(3):
            r()
    n = {}
    for k, r in runs.items():
        t = min(timed_once(r) for _ in range(3))
        n[k] = max(1, min(200, int(target_s / max(t, 1e-7))))
    times = {k: [] for k in runs}
    for _ in range(rounds):
        for k, r in runs.items():
            t0 = CLOCK()
            for _ in range(n[k]):
                r()
            times[k].append((CLOCK() - t0) / n[k] * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_case(name, use_tc, rounds):
    case = zoo.make(name)
    eager_model = copy.deepcopy(case.model)        # eager never sees what a compiler installed
    eager_case = copy.copy(case)
    eager_case.model = eager_model
    ctx = torch.enable_grad() if case.train else torch.no_grad()
    row = {"name": name, "train": case.train}
    with ctx:
        tempa.reset()
        with tempfile.TemporaryDirectory() as d:
            old = tempa.config.cache_dir
            tempa.config.cache_dir = d
            try:
                fast = tempa.compile(copy.deepcopy(case.model))
                run_t = runner(fast, case)
                row["tempa_compile"] = timed_once(run_t, time.perf_counter)   # gcc runs in a child
                s = tempa.stats()
                row["tempa_info"] = f"{s.graphs_compiled} graphs, {s.kernels_compiled} kernels, " \
                                    f"{s.aten_fallbacks} ATen fallbacks"
            finally:
                tempa.config.cache_dir = old
        runs = {"eager": runner(eager_model, eager_case), "tempa": run_t}
        if use_tc:
            torch._dynamo.reset()
            tc_model = torch.compile(copy.deepcopy(case.model))
            run_c = runner(tc_model, case)
            try:
                row["tc_compile"] = timed_once(run_c, time.perf_counter)
                runs["torch.compile"] = run_c
            except Exception as e:  # noqa: BLE001
                row["tc_error"] = f"{type(e).__name__}: {e}"[:80]
        row.update(interleaved(runs, rounds))
    return row


def profile_case(name, calls):
    import segments
    case = zoo.make(name)
    ctx = torch.enable_grad() if case.train else torch.no_grad()
    with ctx:
        tempa.reset()
        segments.install()
        with tempfile.TemporaryDirectory() as d:
            old = tempa.config.cache_dir
            tempa.config.cache_dir = d
            try:
                run = runner(tempa.compile(copy.deepcopy(case.model)), case)
                for _ in range(5):
                    run()
            finally:
                tempa.config.cache_dir = old
        return segments.profile(run, calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch.set_num_threads for all three (default: PyTorch's choice); on a "
                         "2-core machine shared with other jobs, 1 avoids threads waiting on "
                         "descheduled peers")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: time calls by this thread's CPU time (robust to other jobs; "
                         "use with --threads 1)")
    ap.add_argument("--profile", action="store_true",
                    help="time each statement of tempa's wrappers instead of comparing")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    global CLOCK
    CLOCK = time.thread_time if a.clock == "cpu" else time.perf_counter
    names = [n for n in zoo.ALL if n != "graph_break_seed"]
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    load = os.getloadavg()
    if a.profile:
        for name in names:
            print(f"## {name} (load {os.getloadavg()[0]:.2f})\n" + profile_case(name, 10 * a.rounds), flush=True)
        return
    rows = []
    for name in names:
        try:
            row = bench_case(name, not a.no_torch_compile, a.rounds)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: failed: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        rows.append(row)
        tc = row.get("torch.compile", float("nan"))
        print(f"{name:28s} eager {row['eager']:9.1f} us  tempa {row['tempa']:9.1f} us "
              f"({row['eager'] / row['tempa']:5.2f}x, compile {row['tempa_compile']:5.2f} s)  "
              f"torch.compile {tc:9.1f} us ({row['eager'] / tc:5.2f}x, "
              f"compile {row.get('tc_compile', float('nan')):5.2f} s)  [{row['tempa_info']}]",
              file=sys.stderr, flush=True)
    print(f"\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {a.clock} clock, "
          f"load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          f"{os.getloadavg()[0]:.2f}; per call µs (medians of {a.rounds} interleaved rounds)\n")
    print("| model | mode | eager µs | tempa µs | tempa speedup | tempa compile s | "
          "torch.compile µs | torch.compile speedup | torch.compile compile s |")
    print("|---|---|---|---|---|---|---|---|---|")
    st, sc = [], []
    for r in rows:
        e, t = r["eager"], r["tempa"]
        c = r.get("torch.compile")
        st.append(e / t)
        if c:
            sc.append(e / c)
        ctxt = f"{c:.1f} | {e / c:.2f}x | {r['tc_compile']:.1f}" if c else f"— | — | {r.get('tc_error', '')}"
        print(f"| {r['name']} | {'train' if r['train'] else 'no_grad'} | {e:.1f} | {t:.1f} | "
              f"{e / t:.2f}x | {r['tempa_compile']:.2f} | {ctxt} |")

    def geo(xs):
        return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
    print(f"| **geomean** | | | | **{geo(st):.2f}x** | | | **{geo(sc):.2f}x** | |")


if __name__ == "__main__":
    main()
