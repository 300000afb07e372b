"""Shared timing helpers: warm-up, tight loops, medians, ratios; and the driver that runs a
child script under several source trees of tempa in alternating fresh processes."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


def per_call_us(fn, *args, calls: int = 200, rounds: int = 7, warmup: int = 10, **kwargs) -> float:
    """The seed's pattern: warm-up calls, then `calls` calls timed; median over rounds."""
    for _ in range(warmup):
        fn(*args, **kwargs)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args, **kwargs)
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def seconds(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


def interleaved_us(timed: dict, calls: int = 200, rounds: int = 7, warmup: int = 10):
    """Per-call µs of each ``name: (fn, args)``: every round times each callable once, so a
    burst of load hits all of them alike. Returns the medians over the rounds of the calling
    thread's CPU time (which leaves out the waits for a core on a shared machine) and of wall
    clock: ({name: cpu µs}, {name: wall µs})."""
    for fn, args in timed.values():
        for _ in range(warmup):
            fn(*args)
    cpu = {name: [] for name in timed}
    wall = {name: [] for name in timed}
    for _ in range(rounds):
        for name, (fn, args) in timed.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn(*args)
            cpu[name].append((time.thread_time() - c0) / calls * 1e6)
            wall[name].append((time.perf_counter() - t0) / calls * 1e6)
    return ({name: statistics.median(ts) for name, ts in cpu.items()},
            {name: statistics.median(ts) for name, ts in wall.items()})


@dataclass
class TreeRuns:
    """What ``run_trees`` measured: ``results[k]`` the child's JSON results under
    ``trees[k]``, one per run; the load average (1 minute) at the start and at the end."""
    trees: list
    results: list
    load_start: float
    load_end: float


def run_trees(trees: list, child: str, runs: int, argv=(), prime: str | None = None,
              cache_per_run: bool = False, progress=None) -> TreeRuns:
    """Two (or more) versions of tempa side by side: the script ``child`` runs ``runs`` times
    under each source tree, the trees' processes alternating (A, B, A, B, ...) so that load on
    a shared machine moves them alike. Each run is a fresh ``python -c child ARGS`` with
    ``PYTHONPATH`` set to the tree and the tree's own disk cache (a temporary directory, also
    the working directory, so the checkout this is started from is not what gets imported);
    ``cache_per_run``: a new empty cache for every run instead. ``argv``: the child's
    arguments, or ``argv(run, k)`` giving them for run ``run`` of ``trees[k]``. ``prime``: a
    script run once per tree first (with run 0's arguments), to fill its cache (kernels, the
    extensions tempa builds once). The
    child prints its result as JSON on the last line of its output; a child that fails ends
    the benchmark with its error. ``progress(run, k)`` is called after each run."""
    trees = [os.path.abspath(t) for t in trees]
    caches = [tempfile.mkdtemp(prefix="tempa-trees-") for _ in trees]
    load_start = os.getloadavg()[0]
    results: list = [[] for _ in trees]
    def args_of(run, k):
        return argv(run, k) if callable(argv) else list(argv)
    try:
        if prime is not None:
            for k, (tree, cache) in enumerate(zip(trees, caches)):
                _run_child(prime, args_of(0, k), tree, cache)
        for run in range(runs):
            for k, tree in enumerate(trees):
                args = args_of(run, k)
                if cache_per_run:
                    with tempfile.TemporaryDirectory(prefix="tempa-trees-") as cache:
                        out = _run_child(child, args, tree, cache)
                else:
                    out = _run_child(child, args, tree, caches[k])
                if not out.strip():
                    raise SystemExit(f"{tree}: the child printed no result")
                results[k].append(json.loads(out.strip().splitlines()[-1]))
                if progress is not None:
                    progress(run, k)
    finally:
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)
    return TreeRuns(trees, results, load_start, os.getloadavg()[0])


def _run_child(code: str, args: list, tree: str, cache: str) -> str:
    # the tree first; what PYTHONPATH held already stays after it (on a lent GPU machine,
    # packages installed with --target, such as bytecode)
    path = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TEMPA_CACHE_DIR=cache)
    run = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True, cwd=cache, timeout=3600)
    if run.returncode:
        raise SystemExit(f"{tree}: {run.stderr.strip()[-2000:]}")
    return run.stdout
