"""Opt-in per-statement timing of tempa's generated wrappers (``models.py --profile``).

The wrapper is straight-line Python: one statement per allocation, C++ segment call or
extern/ATen call. While profiling, every wrapper built is re-written so that each statement
of ``call`` is bracketed by ``perf_counter`` reads; the report gives the median time per
call of each statement, grouped into C++ segments, extern calls (per op), ATen fallbacks
and allocations, plus the largest single statements. What the wrapper does not see (the
guard, autograd's engine, the benchmark's own ``.sum().backward()``) is the difference to
the per-call total. Timings under load are noisy: compare shares, not absolute figures.
"""
from __future__ import annotations

import re
import statistics
import sys
import time
import types

_MOD = "__tempa_segment_profile__"


class Recorder:
    def __init__(self):
        self.samples: dict = {}           # (wrapper no, line no) -> [seconds per call]
        self.text: dict = {}              # same key -> (statement, what it is)
        self.cur: dict = {}
        self.wrappers = 0

    def record(self, key, dt):
        self.cur[key] = self.cur.get(key, 0.0) + dt

    def end_call(self):
        """Close one model call: move the accumulated times into the samples."""
        for k, v in self.cur.items():
            self.samples.setdefault(k, []).append(v)
        self.cur = {}

    def instrument(self, wsrc: str, ops: dict) -> str:
        wno = self.wrappers
        self.wrappers += 1
        out = [f"import sys as _sys; _rec = _sys.modules[{_MOD!r}].rec.record; "
               f"_pc = _sys.modules[{_MOD!r}].clock"]
        in_call = False
        for no, line in enumerate(wsrc.split("\n")):
            s = line.strip()
            if s.startswith("def call("):
                in_call = True
                out.append(line)
                continue
            ind = line[:len(line) - len(line.lstrip())]
            if in_call and len(ind) == 8 and s and not s.startswith("return"):
                key = (wno, no)
                self.text[key] = (s, _kind(s, ops))
                out += [f"{ind}_t = _pc()", line, f"{ind}_rec({key!r}, _pc() - _t)"]
            else:
                out.append(line)
        return "\n".join(out)

    def report(self, total_us: float, top: int = 15) -> str:
        rows = []
        for k, v in self.samples.items():
            rows.append((statistics.median(v) * 1e6, *self.text[k]))
        by_kind: dict = {}
        for us, s, kind in rows:
            by_kind[kind] = by_kind.get(kind, 0.0) + us
        lines = [f"per call: {total_us:.1f} us in all; inside the wrappers {sum(by_kind.values()):.1f} us"]
        for kind, us in sorted(by_kind.items(), key=lambda x: -x[1]):
            lines.append(f"  {us:9.1f} us  {kind}")
        lines.append(f"largest statements (median us per call):")
        for us, s, kind in sorted(rows, key=lambda r: -r[0])[:top]:
            lines.append(f"  {us:9.1f} us  {s[:110]}")
        return "\n".join(lines)


def _kind(stmt: str, ops: dict) -> str:
    m = re.search(r"\b_S(\d+)\(", stmt)
    if m:
        return "C++ segments"
    m = re.search(r"\b(_o\d+)\(", stmt)
    if m:
        return "ATen: " + ops.get(m.group(1), m.group(1))
    if "_empty(" in stmt or "empty_strided" in stmt:
        return "allocations"
    return "other"


rec = Recorder()


def install(clock=time.perf_counter):
    """Make every wrapper built from now on a timed one (the C++ path's ``instantiate``).
    ``clock``: what times each statement (``time.thread_time`` on a loaded machine, with
    one thread: the statement's own CPU time)."""
    from tempa.backend import compile_graph, dynamic
    sys.modules[_MOD] = types.SimpleNamespace(rec=rec, clock=clock)
    orig = compile_graph.instantiate
    if getattr(orig, "profiled", False):       # installed before: instrument once only
        return rec

    def instantiate(wsrc, *rest, **kwargs):
        ops = dict(re.findall(r"^    (_o\d+) = (.+)$", wsrc, re.M))
        return orig(rec.instrument(wsrc, ops), *rest, **kwargs)
    instantiate.profiled = True
    compile_graph.instantiate = dynamic.instantiate = instantiate
    return rec


def profile(run, calls: int = 50) -> str:
    """Time ``run`` (already warmed up, its wrappers built after ``install``) ``calls`` times."""
    rec.samples, rec.cur = {}, {}
    clock = sys.modules[_MOD].clock
    totals = []
    for _ in range(calls):
        t0 = clock()
        run()
        totals.append(clock() - t0)
        rec.end_call()
    return rec.report(statistics.median(totals) * 1e6, top=int(__import__("os").environ.get("SEG_TOP", 15)))
