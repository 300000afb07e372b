"""mode="max-autotune": benchmark the variants of a kernel at compile time and keep the fastest.

The caller (gpu/gemm_tune.py for matmuls) describes one *site*: a key (what is computed,
on which shapes, dtypes and strides, with which epilogue source), the candidate names, and a
``prepare`` function that compiles them and returns a runner per name (or the exception
that candidate raised). ``Autotuner.pick`` then

  1. looks the key up in this process's memo, then on disk, under
     ``<cache_dir>/autotune/<key[:2]>/<key>.json`` (the key also covers the GPU's name and
     the torch, Triton and tempa versions): a second process does not benchmark again;
  2. otherwise times every runner that compiled (CUDA events, median of a few batches),
     skipping with a log line any candidate that fails to compile, launch or run (too much
     shared memory for a configuration, say), and keeps the fastest;
  3. writes the choice atomically with a hash sidecar (runtime/diskcache.py): a torn or
     foreign entry reads as missing and the site is tuned again, never trusted.

Without a timer (Triton's CPU interpreter, where timings say nothing about a GPU) the
caller's default is chosen without measuring, and still recorded on disk like a measurement.
Tuning that takes more than ``SLOW_SECONDS`` is reported on the ``perf`` log channel
(TEMPA_LOGS=perf): a progress line while it runs and a summary when it ends.

Why here and not in codegen: codegen renders candidates; this module only measures and
remembers (DESIGN.md: codegen never imports runtime).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field

from . import diskcache
from ... import logs
from ...configuration import config

SLOW_SECONDS = 2.0
# Bump when the meaning of a stored choice changes (candidate naming, template semantics).
SCHEMA = 1
_MEMO: dict = {}                   # (cache dir, key digest) -> stored record, for this process


@dataclass
class Decision:
    choice: str
    source: str                    # "benchmarked" | "disk cache" | "memo" | "default (...)"
    times_ms: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    seconds: float = 0.0


class Autotuner:
    """One per compiled graph set; ``log`` is what tempa_info shows as ``autotune``."""

    def __init__(self, options=None):
        self.options = options or {}
        self.log: list = []
        self.benchmarked = 0       # sites timed in this Autotuner (tests: the cache works)
        self.reused = 0            # sites answered by the memo or the disk

    def pick(self, what: str, key: dict, names: list, prepare, timer=None, default: str = None) -> Decision:
        """The fastest of ``names`` for this site (see the module docstring)."""
        digest = key_digest(key)
        memo_key = (config.cache_dir, digest)
        rec = _MEMO.get(memo_key)
        source = "memo"
        if rec is None:
            rec = _load(digest)
            source = "disk cache"
        if rec is not None and rec.get("choice") in names:
            self.reused += 1
            d = Decision(rec["choice"], source, dict(rec.get("times_ms", {})))
            _MEMO[memo_key] = rec
            self._record(what, d)
            return d
        t0 = time.perf_counter()
        if timer is None:
            d = Decision(default if default in names else names[0], "default (not benchmarked here)")
        else:
            d = self._measure(what, names, prepare, timer, default, t0)
        d.seconds = time.perf_counter() - t0
        if d.times_ms or timer is None:
            rec = {"choice": d.choice, "times_ms": d.times_ms, "what": what, "schema": SCHEMA}
            _MEMO[memo_key] = rec
            _store(digest, rec)
        self._record(what, d)
        if d.seconds > SLOW_SECONDS:
            logs.get("perf").info("autotune: %s took %.1f s: %s", what, d.seconds, self.log[-1])
        return d

    def _measure(self, what, names, prepare, timer, default, t0) -> Decision:
        self.benchmarked += 1
        log = logs.get("perf")
        runners = prepare()
        times, failed = {}, {}
        announced = False
        for i, name in enumerate(names):
            run = runners.get(name)
            if run is None or isinstance(run, BaseException):
                failed[name] = _short(run) if run is not None else "not prepared"
                log.info("autotune: %s: skipping %s: %s", what, name, failed[name])
                continue
            try:
                times[name] = timer(run)
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run loses, the rest go on
                failed[name] = _short(e)
                log.info("autotune: %s: skipping %s: %s", what, name, failed[name])
            if not announced and time.perf_counter() - t0 > SLOW_SECONDS:
                announced = True
                log.info("autotune: %s: %d/%d candidates timed after %.1f s ...", what, i + 1, len(names),
                         time.perf_counter() - t0)
        if not times:
            fallback = default if default in names else names[0]
            return Decision(fallback, "default (every candidate failed)", {}, failed)
        best = min(times, key=times.get)
        return Decision(best, "benchmarked", times, failed)

    def _record(self, what: str, d: Decision):
        line = f"{what}: {d.choice}"
        if d.choice in d.times_ms:
            line += f" {d.times_ms[d.choice]:.4f} ms"
        others = sorted((t, n) for n, t in d.times_ms.items() if n != d.choice)
        if others:
            line += " (next: " + ", ".join(f"{n} {t:.4f} ms" for t, n in others[:3]) + ")"
        line += f" [{d.source}"
        if d.source == "benchmarked":
            line += f", {len(d.times_ms)} timed"
            if d.failed:
                line += f", {len(d.failed)} failed"
            line += f", {d.seconds:.1f} s"
        self.log.append(line + "]")


# --- timers -----------------------------------------------------------------------------------

def cuda_timer(run, budget_ms: float = 30.0, batches: int = 5) -> float:
    """Median milliseconds per call of ``run`` on the current CUDA stream (events)."""
    import torch
    run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    est = max(start.elapsed_time(end), 1e-3)
    reps = int(max(1, min(100, budget_ms / batches / est)))
    per = []
    for _ in range(batches):
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / reps)
    return statistics.median(per)


def wall_timer(run, reps: int = 3) -> float:
    """Median wall-clock milliseconds per call (CPU runners; tests)."""
    run()
    per = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        per.append((time.perf_counter() - t) * 1e3)
    return statistics.median(per)


# --- the disk entries -------------------------------------------------------------------------

def environment() -> dict:
    """What a measurement depends on besides the site: the GPU and the software versions."""
    import torch
    env = {"torch": torch.__version__, "tempa": diskcache.VERSION, "schema": SCHEMA}
    try:
        import triton
        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
    else:
        env["device"] = "cpu (triton interpreter)" if os.environ.get("TRITON_INTERPRET") == "1" else "cpu"
    return env


def key_digest(key: dict) -> str:
    text = json.dumps({"site": key, "env": environment()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def entry_path(digest: str) -> str:
    d = os.path.join(os.path.expanduser(config.cache_dir), "autotune", digest[:2])
    return os.path.join(d, digest + ".json")


def _load(digest: str):
    if not config.disk_cache:
        return None
    data = diskcache.load_verified(entry_path(digest))
    if data is None:
        return None
    try:
        rec = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or not isinstance(rec.get("choice"), str):
        return None
    return rec


def _store(digest: str, rec: dict) -> None:
    if not config.disk_cache:
        return
    p = entry_path(digest)
    try:
        os.makedirs(os.path.dirname(p), mode=0o700, exist_ok=True)
        diskcache.store_file(p, data=json.dumps(rec, sort_keys=True).encode())
    except OSError as e:             # a read-only or full disk costs a re-tune, not the compile
        logs.get("perf").info("autotune: could not store %s: %s", p, e)


def clear_memo() -> None:
    """Forget this process's choices (tests: force the disk to answer)."""
    _MEMO.clear()


def _short(e) -> str:
    s = f"{type(e).__name__}: {e}" if isinstance(e, BaseException) else str(e)
    s = s.strip().splitlines()[0] if s.strip() else s
    return s[:200]
