"""Does compiling pay off for this model? Eager vs compiled, measured in one process.

How each number is measured (also in `tempa bench --help` and examples/README.md):

- per-call time: after warm-up (10 calls, as the seed's pattern), ROUNDS rounds each time
  a block of eager calls and a block of compiled calls back to back, one call at a time with
  perf_counter (which side goes first alternates by round), so both sides meet the same load
  drift; reported: the median and the interquartile range (IQR, q3 - q1) of each side's
  calls, and the speed-up, eager's median over compiled's. Eager is also timed once BEFORE
  anything is compiled in the process: generated kernels run their own thread pool, and on
  a small machine its threads can keep spinning and slow down eager code that runs after
  them (measured on the 2-core machine: the seed MLP's eager calls went from 0.24 ms to
  3.8 ms right after compiled calls); when the interleaved eager calls are much slower than
  those, the bench says so (``eager_after_s``).
- the speed-up's 95% interval: the 2.5th and 97.5th percentile of the speed-up over 2,000
  bootstrap resamples of the rounds (seeded: the same samples give the same interval).
  When it contains 1.0x the verdict is "cannot tell at this noise" instead of a cause.
- first call cold: a fresh process with an empty disk cache (tempa.tools.firstcall) times
  the first compiled call; this is what a user pays the first time they run their program.
- first call warm: the same in a second fresh process whose disk cache the first one filled;
  what every later start-up of the program pays.
- break-even: the number of calls n after which compiling has paid for itself,
  first_call + (n - 1) * compiled  <=  n * eager,  so  n = ceil((first - compiled) /
  (eager - compiled)); none when compiled is not faster per call.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field

from .load import Target, TargetError, check_eager

SCHEMA = "tempa.bench/1"
MODES = ("default", "reduce-overhead", "max-autotune")
STAT_FIELDS = ("captures", "recompiles", "graph_breaks", "eager_fallbacks", "graphs_compiled",
               "kernels_compiled", "aten_fallbacks", "disk_cache_hits", "gcc_runs")
# Within this ratio of 1.0 the two sides are "about the same": the IQR of tight loops on a
# loaded 2-core machine is a few percent.
NOISE = 0.03
ROUNDS = 12              # interleaved rounds for the speed-up's interval
BOOTSTRAP_RESAMPLES = 2000


# -- small helpers -----------------------------------------------------------------------
def resolve_backend(name: str):
    """'tempa', 'eager', or 'module:function' naming a backend(gm, example_inputs) callable."""
    if ":" in name:
        mod, attr = name.rsplit(":", 1)
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise TargetError(f"--backend {name}: cannot import it ({e}); use 'tempa', "
                              "'eager' or 'module:function'") from None
    if name not in ("tempa", "eager"):
        raise TargetError(f"--backend {name}: unknown backend; use 'tempa', 'eager' or "
                          "'module:function' (a callable backend(gm, example_inputs))")
    return name


def sync_for(device: str):
    if device == "cuda":
        import torch
        return torch.cuda.synchronize
    return lambda: None


@dataclass
class Timing:
    median_s: float
    q1_s: float
    q3_s: float
    iqr_s: float
    calls: int

    @staticmethod
    def of(samples_ns: list[int]) -> "Timing":
        s = sorted(samples_ns)
        q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
        return Timing(q[1] / 1e9, q[0] / 1e9, q[2] / 1e9, (q[2] - q[0]) / 1e9, len(s))


@dataclass
class ModeResult:
    mode: str
    ok: bool = True
    error: str | None = None
    first_call_cold_s: float | None = None
    first_call_warm_s: float | None = None
    first_call_in_process_s: float | None = None
    first_call_method: str = "subprocess"      # "subprocess" | "in-process"
    timing: Timing | None = None
    speedup: float | None = None
    graphs: int | None = None                 # compiled entries (graphs) after the calls
    kernels: int | None = None                # generated kernels over all graphs
    break_even_calls: int | None = None       # with the cold first call
    break_even_calls_warm: int | None = None  # with the warm first call
    stats: dict = field(default_factory=dict)
    fallback_messages: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    verdict: str = ""
    speedup_ci: tuple | None = None           # 95% interval of the speed-up (interleaved rounds)
    rounds: int = 0                           # interleaved rounds behind speedup_ci
    eager_after_s: float | None = None        # eager median interleaved with the compiled calls
    eager_timing: Timing | None = None        # the interleaved eager calls (the speed-up's base)
    samples_ns: list[int] = field(default_factory=list)   # for the report's chart; not in JSON
    eager_samples_ns: list[int] = field(default_factory=list)   # the same, eager; not in JSON
    compiled: object = None                                # for the report; not in JSON


@dataclass
class BenchResult:
    spec: str
    name: str
    inputs: str
    device: str
    no_grad: bool
    backend: str
    eager_first_call_s: float
    eager: Timing
    eager_samples_ns: list[int]
    modes: list[ModeResult]
    environment: dict

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "target": {"spec": self.spec, "name": self.name, "inputs": self.inputs,
                       "device": self.device, "no_grad": self.no_grad, "backend": self.backend},
            "environment": self.environment,
            "eager": {"first_call_s": self.eager_first_call_s, **asdict(self.eager)},
            "modes": [_mode_json(m) for m in self.modes],
        }


def _mode_json(m: ModeResult) -> dict:
    d = {k: v for k, v in asdict(m).items()
         if k not in ("samples_ns", "eager_samples_ns", "compiled", "timing", "eager_timing")}
    d.update(asdict(m.timing) if m.timing else
             {"median_s": None, "q1_s": None, "q3_s": None, "iqr_s": None, "calls": 0})
    return d


def environment() -> dict:
    import torch
    import tempa
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"tempa": getattr(tempa, "__version__", "?"), "torch": torch.__version__,
            "load_average": load, "cpus": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu,
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# -- progress on stderr while something slow runs -----------------------------------------
class Progress:
    """Says what is running once it has taken longer than ``after`` seconds; silent otherwise."""

    def __init__(self, label: str, *, enabled: bool = True, after: float = 1.5, stream=None):
        self.label, self.enabled, self.after = label, enabled, after
        self.stream = stream or sys.stderr
        self.shown = False
        self._done = threading.Event()

    def __enter__(self):
        self.t0 = time.perf_counter()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        if self._done.wait(self.after):
            return
        tty = self.stream.isatty()
        self.shown = True
        self.stream.write(f"tempa: {self.label} ...")
        self.stream.flush()
        while tty and not self._done.wait(0.5):
            self.stream.write(f"\rtempa: {self.label} ... {time.perf_counter() - self.t0:.1f} s")
            self.stream.flush()

    def __exit__(self, *exc):
        self._done.set()
        if self.enabled:
            self._thread.join()
        if self.shown:
            end = "failed" if exc[0] else "done"
            took = f"{end} in {time.perf_counter() - self.t0:.1f} s\n"
            if self.stream.isatty():
                self.stream.write(f"\rtempa: {self.label} ... {took}")
            else:   # a log file: finish the line the start wrote, no carriage returns
                self.stream.write(f" {took}")
            self.stream.flush()
        return False


# -- what tempa said while we ran it ------------------------------------------------------
class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        try:
            self.messages.append(record.getMessage())
        except Exception:  # a bad format string must not break the bench
            self.messages.append(str(record.msg))


@contextlib.contextmanager
def collect_logs(*channels: str):
    """Collect the messages of tempa's log channels (and tempa's warnings) instead of letting
    them go to stderr: the bench and the report show them where they belong."""
    handlers = {}
    for ch in channels:
        logger = logging.getLogger("tempa." + ch)
        h = _Collect()
        handlers[ch] = h
        saved = (logger.level, logger.propagate)
        logger.addHandler(h)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        h._saved = saved
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield handlers
        finally:
            for ch, h in handlers.items():
                logger = logging.getLogger("tempa." + ch)
                logger.removeHandler(h)
                logger.setLevel(h._saved[0])
                logger.propagate = h._saved[1]
            for w in caught:   # tempa's own warnings (recompile limit, backend fallbacks)
                msg = str(w.message)
                if ("tempa" in msg or "/tempa/" in w.filename) and \
                        msg not in handlers[channels[0]].messages:
                    handlers[channels[0]].messages.append(msg)


def stats_delta(before, after) -> dict:
    return {f: getattr(after, f, 0) - getattr(before, f, 0) for f in STAT_FIELDS}


# -- the measurement ----------------------------------------------------------------------
def first_call_subprocess(spec: str, mode: str, backend: str, device: str, no_grad: bool,
                          cache_dir: str, timeout: float = 600) -> dict:
    cmd = [sys.executable, "-m", "tempa.tools.firstcall", spec, "--mode", mode,
           "--backend", backend, "--device", device] + (["--no-grad"] if no_grad else [])
    env = dict(os.environ, TEMPA_CACHE_DIR=cache_dir)
    env.pop("TEMPA_LOGS", None)
    # The child must import this same tempa, wherever the bench was started from.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"the first call took longer than {timeout:.0f} s"}
    from .firstcall import MARKER
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"ok": False, "error": f"the first-call process exited with status {p.returncode}: "
                                  f"{tail}"}


def _auto_calls(per_call_s: float, budget_s: float) -> int:
    # Enough calls for ~budget_s per side: thousands for a 20 µs model, at least 20 for a
    # slow one (its per-call noise is small relative to its time anyway).
    return max(20, min(20000, int(budget_s / max(per_call_s, 1e-7))))


def _estimate(fn, args, kwargs, sync, n: int = 5) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args, **kwargs)
    sync()
    return (time.perf_counter() - t0) / n


def _time_block(fn, args, kwargs, n, sync, out: list[int], limit_s: float | None = None):
    """Time ``n`` calls one by one into ``out`` (ns); with ``limit_s``, stop early once the
    calls have taken that long (at least 20 calls): a machine that suddenly gets busy must
    not turn a half-second measurement into a minute."""
    pc = time.perf_counter_ns
    limit = int(limit_s * 1e9) if limit_s else None
    total = 0
    for i in range(n):
        t0 = pc()
        fn(*args, **kwargs)
        sync()
        dt = pc() - t0
        out.append(dt)
        if limit is not None:
            total += dt
            if total > limit and i >= 19:
                break


def run(target: Target, *, modes=("default",), backend: str = "tempa", device: str = "cpu",
        no_grad: bool = False, warmup: int = 10, calls: int | None = None,
        budget_s: float = 0.5, first_call: str = "subprocess",
        progress: bool = True, keep_compiled: bool = False, debug: bool = False) -> BenchResult:
    """Measure ``target`` eager and compiled in each mode. ``first_call`` is "subprocess"
    (cold and warm, each in a fresh process) or "in-process" (cold only, this process)."""
    import torch
    import tempa

    for m in modes:
        if m not in MODES:
            raise TargetError(f"--mode {m}: unknown mode; use one or more of {', '.join(MODES)}")
    backend_obj = resolve_backend(backend)
    target = target.to(device)
    sync = sync_for(device)
    grad = torch.no_grad if no_grad else contextlib.nullcontext
    args, kwargs, model = target.args, target.kwargs, target.model

    with grad():
        t0 = time.perf_counter()
        check_eager(target, debug)
        sync()
        eager_first = time.perf_counter() - t0
        for _ in range(warmup):
            model(*args, **kwargs)
        sync()
        eager_samples: list[int] = []
        n = calls or _auto_calls(_estimate(model, args, kwargs, sync), budget_s)
        with Progress(f"timing {n:,} eager calls", enabled=progress, after=3):
            _time_block(model, args, kwargs, n, sync, eager_samples,
                        None if calls else 4 * budget_s)
    eager = Timing.of(eager_samples)

    results = []
    saved_cache_dir = tempa.config.cache_dir
    for mode in modes:
        r = ModeResult(mode, first_call_method=first_call)
        cache_dir = tempfile.mkdtemp(prefix="tempa-bench-")
        try:
            if first_call == "subprocess":
                with Progress(f"first call of {target.name} [{mode}] in a fresh process, cold "
                              "disk cache", enabled=progress):
                    cold = first_call_subprocess(target.spec, mode, backend, device, no_grad,
                                                 cache_dir)
                if cold.get("ok"):
                    r.first_call_cold_s = cold["first_call_s"]
                    with Progress(f"first call of {target.name} [{mode}] in a fresh process, "
                                  "warm disk cache", enabled=progress):
                        warm = first_call_subprocess(target.spec, mode, backend, device,
                                                     no_grad, cache_dir)
                    if warm.get("ok"):
                        r.first_call_warm_s = warm["first_call_s"]
                else:
                    r.fallback_messages.append("first-call process: " + cold.get("error", "?"))
            tempa.config.cache_dir = cache_dir
            _measure_mode(r, target, mode, backend_obj, sync, grad, warmup, calls, budget_s,
                          progress, debug)
            if r.first_call_cold_s is None and r.ok:
                r.first_call_cold_s = r.first_call_in_process_s
                if first_call == "subprocess":
                    r.first_call_method = "in-process"
        finally:
            tempa.config.cache_dir = saved_cache_dir
            shutil.rmtree(cache_dir, ignore_errors=True)
        if not keep_compiled:
            r.compiled = None
        results.append(r)

    for r in results:
        _conclude(r, eager)
    # the table's eager row: the calls interleaved with the (first) compiled mode's, which
    # its speed-up divides by; the block timed alone serves the interference note
    shown = next((r for r in results if r.eager_timing), None)
    if shown is not None:
        eager, eager_samples = shown.eager_timing, shown.eager_samples_ns
    return BenchResult(target.spec, target.name, target.describe_inputs(), device, no_grad,
                       backend, eager_first, eager, eager_samples, results, environment())


def _measure_mode(r: ModeResult, target, mode, backend_obj, sync, grad, warmup, calls,
                  budget_s, progress, debug):
    import tempa
    args, kwargs, model = target.args, target.kwargs, target.model
    tempa.reset()
    before = tempa.stats()
    with collect_logs("fallbacks", "recompiles", "breaks") as logs_, grad():
        try:
            compiled = tempa.compile(model, mode=None if mode == "default" else mode,
                                     backend=backend_obj)
            with Progress(f"compiling {target.name} [{mode}]", enabled=progress):
                t0 = time.perf_counter()
                out = compiled(*args, **kwargs)
                sync()
                r.first_call_in_process_s = time.perf_counter() - t0
            random_ops = random_modules_in_training(model)
            if random_ops:
                r.fallback_messages.append(
                    f"outputs not compared with eager: the model is in training mode with "
                    f"random ops ({', '.join(random_ops[:3])}), whose values differ per call; "
                    "call model.eval() before benchmarking to have them compared")
            else:
                _check_same(model(*args, **kwargs), out)
            for _ in range(warmup):
                compiled(*args, **kwargs)
            sync()
            n = calls or _auto_calls(_estimate(compiled, args, kwargs, sync), budget_s)
            with Progress(f"timing {n:,} eager and {n:,} compiled calls [{mode}] in "
                          f"{ROUNDS} rounds", enabled=progress, after=3):
                rounds = interleaved_rounds(model, compiled, args, kwargs, sync,
                                            per_round=max(2, -(-n // ROUNDS)),
                                            limit_s=None if calls else 8 * budget_s)
            r.eager_samples_ns = [t for e, _ in rounds for t in e]
            r.samples_ns = [t for _, c in rounds for t in c]
            r.eager_timing, r.timing = Timing.of(r.eager_samples_ns), Timing.of(r.samples_ns)
            r.eager_after_s = r.eager_timing.median_s
            r.speedup_ci, r.rounds = speedup_interval(rounds), len(rounds)
            r.compiled = compiled
            _describe_entries(r, compiled)
            r.fallback_messages += tempa.stance_decisions(compiled)
        except Exception as e:
            if debug:
                raise
            r.ok = False
            r.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            r.compiled = None
    r.stats = stats_delta(before, tempa.stats())
    for ch in ("fallbacks", "breaks", "recompiles"):
        for msg in logs_[ch].messages:
            # stance auto's choices came in above, from tempa.stance_decisions
            if msg not in r.fallback_messages and "stance auto:" not in msg:
                r.fallback_messages.append(msg)


def _describe_entries(r: ModeResult, compiled):
    """Graph and kernel counts, and any graph the backend handed back to eager."""
    from .explain import entries
    infos = entries(compiled)
    r.graphs = len(infos)
    ks = [g.kernel_count for g in infos if g.kernel_count is not None]
    r.kernels = sum(ks) if ks else None
    for g in infos:
        if g.fallback_reason:
            msg = f"backend ran a graph of {g.function} eagerly: {g.fallback_reason}"
            if msg not in r.fallback_messages:
                r.fallback_messages.append(msg)


def interleaved_rounds(model, compiled, args, kwargs, sync, *, rounds: int = ROUNDS,
                       per_round: int = 10, limit_s: float | None = None) -> list[tuple]:
    """``rounds`` x (eager call times, compiled call times), in ns: per round, ``per_round``
    calls of each side back to back, which side goes first alternating by round. With
    ``limit_s``, fewer rounds once that much time went by (at least 3)."""
    out = []
    start = time.perf_counter()
    for i in range(rounds):
        eager_ns: list[int] = []
        compiled_ns: list[int] = []
        sides = [(model, eager_ns), (compiled, compiled_ns)]
        for fn, samples in (sides if i % 2 == 0 else sides[::-1]):
            _time_block(fn, args, kwargs, per_round, sync, samples)
        out.append((eager_ns, compiled_ns))
        if limit_s is not None and i >= 2 and time.perf_counter() - start > limit_s:
            break
    return out


def _speedup_of(rounds) -> float:
    eager = statistics.median(t for e, _ in rounds for t in e)
    return eager / max(statistics.median(t for _, c in rounds for t in c), 1)


def speedup_interval(rounds: list[tuple], level: float = 0.95,
                     resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float] | None:
    """The bootstrap percentile interval of the speed-up (eager's median call time over
    compiled's), resampling whole rounds (None: fewer than 3 rounds)."""
    import random
    if len(rounds) < 3:
        return None
    rng = random.Random(0)
    speedups = sorted(_speedup_of(rng.choices(rounds, k=len(rounds))) for _ in range(resamples))
    tail = (1 - level) / 2
    return speedups[int(tail * resamples)], speedups[min(resamples - 1, int((1 - tail) * resamples))]


def random_modules_in_training(model) -> list[str]:
    """Names of the submodules that draw random numbers in this call (dropout in training
    mode): eager and compiled outputs then differ by design, not by a bug."""
    import torch
    if not isinstance(model, torch.nn.Module):
        return []
    found = []
    for name, sub in model.named_modules():
        if not sub.training:
            continue
        p = getattr(sub, "p", None) if isinstance(sub, torch.nn.modules.dropout._DropoutNd) \
            else getattr(sub, "dropout", None) if isinstance(sub, torch.nn.MultiheadAttention) \
            else None
        if isinstance(p, float) and p > 0:
            found.append(f"{name or type(model).__name__}: {type(sub).__name__}(p={p})")
    return found


def _check_same(expected, got):
    """Compiled results must match eager; a mismatch is a tempa bug worth shouting about."""
    import torch
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        if expected.shape != got.shape or not torch.allclose(expected, got, atol=1e-4, rtol=1e-3):
            raise AssertionError("the compiled model's output differs from eager (atol 1e-4)")


def break_even(first_s: float | None, eager_s: float, compiled_s: float) -> int | None:
    if first_s is None or compiled_s >= eager_s:
        return None
    return max(1, math.ceil((first_s - compiled_s) / (eager_s - compiled_s)))


def _conclude(r: ModeResult, eager: Timing):
    """``eager``: the calls timed alone, before compiling; the speed-up divides the eager
    calls interleaved with this mode's when there are (``r.eager_timing``)."""
    alone = eager
    eager = r.eager_timing or eager
    if not r.ok:
        r.verdict = (f"compiling failed ({r.error}); the model runs eagerly at "
                     f"{fmt_time(eager.median_s)} per call")
        r.reasons = [r.error]
        return
    c, e = r.timing.median_s, eager.median_s
    r.speedup = e / c if c > 0 else None
    r.break_even_calls = break_even(r.first_call_cold_s, e, c)
    r.break_even_calls_warm = break_even(r.first_call_warm_s, e, c)
    r.reasons = _reasons(r, eager)
    if r.kernels == 0 and any("eagerly" in m or "failed" in m for m in r.fallback_messages):
        # Nothing was compiled: a speed-up here would be noise around the same ATen calls.
        first = next(m for m in r.fallback_messages if "eagerly" in m or "failed" in m)
        r.verdict = (f"nothing was compiled ({_short(first)}), so the compiled column is the "
                     f"same ATen calls as eager plus tempa's dispatch ({r.speedup:.2f}x); no "
                     "verdict")
        return
    if r.eager_after_s and r.eager_after_s > 1.5 * alone.median_s:
        r.fallback_messages.append(
            f"eager calls interleaved with the compiled ones ran {r.eager_after_s / alone.median_s:.1f}x "
            f"slower than eager timed alone ({fmt_time(alone.median_s)} -> "
            f"{fmt_time(r.eager_after_s)}): either the machine got busier, "
            "or the generated kernels' threads compete with PyTorch's here, a cost that code "
            "mixing eager and compiled parts (graph breaks) pays on every call")
    undecided = _cannot_tell(r)
    if undecided:
        r.verdict = undecided
        r.break_even_calls = r.break_even_calls_warm = None   # no point estimate to trust
    elif r.speedup is not None and r.speedup > 1 + NOISE and r.break_even_calls is not None:
        r.verdict = f"compiling pays off after {r.break_even_calls:,} calls"
        if r.break_even_calls_warm is not None:
            r.verdict += f" ({r.break_even_calls_warm:,} with a warm disk cache)"
        r.verdict += (f": {r.speedup:.2f}x faster per call, after a first call of "
                      f"{fmt_time(r.first_call_cold_s)}")
    elif r.speedup is not None and r.speedup >= 1 - NOISE:
        r.verdict = ("compiling does not pay off here: compiled runs about as fast as eager "
                     f"({r.speedup:.2f}x), so the first call's {fmt_time(r.first_call_cold_s)} "
                     f"is never won back; {r.reasons[0]}")
    else:
        r.verdict = (f"compiled is slower than eager here ({r.speedup:.2f}x) because "
                     f"{r.reasons[0]}")
    if r.speedup_ci and not undecided:
        r.verdict += f" (95% interval {fmt_ci(r.speedup_ci)})"


def _cannot_tell(r: ModeResult) -> str | None:
    """The verdict when the noise hides the answer: the interval contains 1.0x."""
    if not r.speedup_ci or r.speedup is None:
        return None
    lo, hi = r.speedup_ci
    if lo <= 1.0 <= hi:
        return (f"cannot tell at this noise whether compiled is faster: {r.speedup:.2f}x, "
                f"95% interval {fmt_ci(r.speedup_ci)} over {r.rounds} interleaved rounds, "
                "contains 1.0x. Rerun on an idle machine, or with more --calls")
    return None


def fmt_ci(ci) -> str:
    return f"{ci[0]:.2f}x-{ci[1]:.2f}x"


def _reasons(r: ModeResult, eager: Timing) -> list[str]:
    """Why compiled is not (much) faster, most decisive first."""
    s = r.stats
    out = []
    msgs = " ".join(r.fallback_messages)
    if s.get("eager_fallbacks") and not r.graphs:
        first = next((m for m in r.fallback_messages if "eagerly" in m), "")
        out.append("tempa runs the whole forward eagerly" +
                   (f" ({_short(first)})" if first else "") +
                   ", so each call is eager plus tempa's dispatch")
    elif s.get("graph_breaks"):
        out.append(f"of graph breaks ({s['graph_breaks']}): the code between graphs runs in "
                   "Python and each graph is entered separately")
    if ("backend unavailable" in msgs or "backend ran a graph" in msgs
            or ("backend" in msgs and "failed" in msgs)):
        out.append("the tempa backend fell back to running the captured graph op by op "
                   "with ATen (no generated kernels)")
    elif s.get("aten_fallbacks"):
        out.append(f"{s['aten_fallbacks']} ops ran as ATen library calls instead of "
                   "generated kernels (eager fallbacks inside the graph)")
    if s.get("recompiles"):
        out.append(f"of {s['recompiles']} recompiles while running")
    if r.timing and r.timing.median_s >= eager.median_s * (1 - NOISE):
        out.append(f"the per-call overhead of the compiled path (guard checks and the wrapper) "
                   f"is not won back by faster kernels on a model this small (eager takes "
                   f"{fmt_time(eager.median_s)} per call)")
    return out or ["no obstacle found: the compiled code is simply not faster on these shapes"]


def _short(msg: str, n: int = 140) -> str:
    msg = msg.replace("tempa: ", "").split(". Hint:")[0]
    return msg if len(msg) <= n else msg[: n - 3] + "..."


# -- formatting ---------------------------------------------------------------------------
def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def table(res: BenchResult) -> str:
    rows = [("", "first call cold", "first call warm", "per call (median)", "IQR", "speedup",
             "95% interval", "graphs", "breaks", "break-even")]
    rows.append(("eager", fmt_time(res.eager_first_call_s), "-", fmt_time(res.eager.median_s),
                 fmt_time(res.eager.iqr_s), "1.00x", "-", "-", "-", "-"))
    for m in res.modes:
        if not m.ok:
            rows.append((f"tempa [{m.mode}]", "failed", "-", "-", "-", "-", "-", "-", "-", "-"))
            continue
        be = f"{m.break_even_calls:,} calls" if m.break_even_calls is not None else \
            "?" if m.verdict.startswith("cannot tell") else "never"
        rows.append((f"tempa [{m.mode}]", fmt_time(m.first_call_cold_s),
                     fmt_time(m.first_call_warm_s), fmt_time(m.timing.median_s),
                     fmt_time(m.timing.iqr_s), f"{m.speedup:.2f}x" if m.speedup else "-",
                     fmt_ci(m.speedup_ci) if m.speedup_ci else "-",
                     str(m.graphs if m.graphs is not None else "-"),
                     str(m.stats.get("graph_breaks", "-")), be))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def busy_note(res: BenchResult) -> str | None:
    """Say so when other work shared the machine: the numbers are then noisy."""
    load, cpus = res.environment.get("load_average"), res.environment.get("cpus") or 1
    if load is not None and load > cpus * 0.9:
        return (f"note: the machine was busy (load average {load:.1f} on {cpus} CPUs): "
                "timings are noisy, eager ones especially (PyTorch's threads wait for a core); "
                "rerun on an idle machine for numbers to quote.")
    return None


def render_text(res: BenchResult) -> str:
    out = [f"tempa bench: {res.name}({res.inputs})  device={res.device}  "
           f"{'no_grad' if res.no_grad else 'grad mode'}  backend={res.backend}", "",
           table(res), ""]
    for m in res.modes:
        out.append(f"[{m.mode}] {m.verdict}.")
        for msg in m.fallback_messages[:3]:
            out.append(f"    note: {_short(msg, 320)}")
    methods = {m.first_call_method for m in res.modes}
    out.append("")
    busy = busy_note(res)
    if busy:
        out += [busy, ""]
    if "subprocess" in methods:
        out.append("first call cold/warm: timed in a fresh process with an empty / a filled "
                   "disk cache; per call: median of calls timed one by one after 10 warm-up "
                   "calls.")
    else:
        out.append("first call cold: timed in this process with an empty disk cache (warm not "
                   "measured: --first-call in-process); per call: median after warm-up.")
        if len(res.modes) > 1:
            out.append("(modes after the first reuse this process's imports and in-memory "
                       "caches, so their first call is an underestimate; the default "
                       "--first-call subprocess measures each mode in fresh processes.)")
    return "\n".join(out)
