"""Render one self-contained HTML page from a bench result and an explanation.

Everything is inline (CSS, the small script, SVG charts) so the file can be mailed, attached
to an issue or opened offline. Every string from the user's model or from tempa is escaped.
"""
from __future__ import annotations

import datetime
from html import escape

from ..tools.bench import BenchResult, ModeResult, NOISE, fmt_ci, fmt_time
from ..tools.explain import Explanation, GraphInfo
from . import svg
from .style import CSS, JS

SECTIONS = (("verdict", "Verdict"), ("bench", "Timing"), ("charts", "Charts"),
            ("graphs", "Graphs"), ("breaks", "Graph breaks"), ("guards", "Guards"),
            ("recompiles", "Recompiles"), ("fallbacks", "Eager fallbacks"),
            ("kernels", "Generated code"), ("environment", "Environment"))


def page(res: BenchResult, ex: Explanation, generated: list[GraphInfo]) -> str:
    title = f"tempa report: {res.name}"
    body = [
        f"<header><h1>{escape(title)}</h1><div class='sub'>{escape(res.name)}"
        f"({escape(res.inputs)}) · device {escape(res.device)} · "
        f"{'no_grad' if res.no_grad else 'grad mode'} · backend {escape(res.backend)} · "
        f"{escape(res.spec)} · generated {datetime.datetime.now():%Y-%m-%d %H:%M}</div></header>",
        "<nav>" + "".join(f"<a href='#{sid}'>{escape(name)}</a>" for sid, name in SECTIONS)
        + "</nav>", "<main>",
        _verdict(res), _bench(res), _charts(res), _graphs(ex), _breaks(ex), _guards(ex),
        _recompiles(ex, res), _fallbacks(ex, res), _kernels(generated, res), _environment(res),
        "</main>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "\n".join(body) + f"<script>{JS}</script></body></html>\n")


def _section(sid: str, title: str, inner: str, extra: str = "") -> str:
    return f"<section id='{sid}'><h2>{escape(title)}{extra}</h2>\n{inner}\n</section>"


def _pre(text: str, cls: str = "") -> str:
    return f"<pre class='{cls}'>{escape(text or '')}</pre>"


def _empty(text: str) -> str:
    return f"<p class='empty'>{escape(text)}</p>"


def _tone(m: ModeResult) -> str:
    if not m.ok:
        return "bad"
    if m.verdict.startswith("cannot tell"):
        return "warn"
    if m.speedup and m.speedup > 1 + NOISE and m.break_even_calls is not None:
        return "good"
    return "warn" if m.speedup and m.speedup >= 1 - NOISE else "bad"


def _verdict(res: BenchResult) -> str:
    out = []
    for m in res.modes:
        # "cannot tell" names no cause: the noise hides whether there is anything to explain
        reasons = "" if _tone(m) == "good" or not m.ok or m.verdict.startswith("cannot tell") else (
            "<ul>" + "".join(f"<li>{escape(r)}</li>" for r in m.reasons) + "</ul>")
        out.append(f"<div class='verdict {_tone(m)}' data-item><span class='mode'>"
                   f"[{escape(m.mode)}]</span>{escape(m.verdict)}.{reasons}</div>")
    return _section("verdict", "Does compiling pay off?", "\n".join(out))


def _bench(res: BenchResult) -> str:
    head = ("<tr><th></th><th>first call cold</th><th>first call warm</th><th>per call "
            "(median)</th><th>IQR</th><th>speedup</th><th>95% interval</th><th>graphs</th>"
            "<th>breaks</th>"
            "<th>kernels</th><th>break-even (cold / warm)</th></tr>")
    rows = [f"<tr><td>eager</td><td>{fmt_time(res.eager_first_call_s)}</td><td>-</td>"
            f"<td>{fmt_time(res.eager.median_s)}</td><td>{fmt_time(res.eager.iqr_s)}</td>"
            f"<td>1.00x</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>"]
    for m in res.modes:
        if not m.ok:
            rows.append(f"<tr><td>tempa [{escape(m.mode)}]</td><td class='failed' colspan='10'>"
                        f"failed: {escape(m.error or '?')}</td></tr>")
            continue
        unsure = m.verdict.startswith("cannot tell")
        be = lambda n, f: "-" if f is None else (  # noqa: E731
            f"{n:,}" if n is not None else "?" if unsure else "never")
        rows.append(
            f"<tr><td>tempa [{escape(m.mode)}]</td><td>{fmt_time(m.first_call_cold_s)}</td>"
            f"<td>{fmt_time(m.first_call_warm_s)}</td><td>{fmt_time(m.timing.median_s)}</td>"
            f"<td>{fmt_time(m.timing.iqr_s)}</td><td>{m.speedup:.2f}x</td>"
            f"<td>{fmt_ci(m.speedup_ci) if m.speedup_ci else '-'}</td>"
            f"<td>{m.graphs if m.graphs is not None else '-'}</td>"
            f"<td>{m.stats.get('graph_breaks', '-')}</td>"
            f"<td>{m.kernels if m.kernels is not None else '-'}</td>"
            f"<td>{be(m.break_even_calls, m.first_call_cold_s)} / "
            f"{be(m.break_even_calls_warm, m.first_call_warm_s)}</td></tr>")
    method = ("first call cold: a fresh process with an empty disk cache; warm: a second "
              "fresh process finding the cache filled by the first. "
              if any(m.first_call_method == "subprocess" for m in res.modes) else
              "first call cold: timed in the bench's process with an empty disk cache; warm "
              "not measured. ")
    counts = ", ".join([f"{res.eager.calls:,} eager"] + [
        f"{m.timing.calls:,} compiled [{m.mode}]" for m in res.modes if m.timing])
    note = (f"<p class='muted'>{escape(method)}Per call: {escape(counts)} calls timed one "
            "by one after 10 warm-up calls, in rounds that alternate eager and compiled "
            "blocks; median and interquartile range; the speed-up's 95% interval is a "
            "bootstrap over the rounds. Break-even: calls n until first call + (n-1) × compiled "
            "≤ n × eager.</p>")
    with_stats = [m for m in res.modes if m.stats]
    stats_html = ""
    if with_stats:
        head_s = "<tr><th>counter</th>" + "".join(f"<th>{escape(m.mode)}</th>"
                                                   for m in with_stats) + "</tr>"
        rows_s = "".join(f"<tr><td>{escape(k)}</td>" + "".join(
            f"<td>{m.stats.get(k, '-')}</td>" for m in with_stats) + "</tr>"
            for k in with_stats[0].stats)
        stats_html = (f"<details><summary>tempa.stats() during the compiled run</summary>"
                      f"<table>{head_s}{rows_s}</table></details>")
    from ..tools.bench import busy_note
    busy = busy_note(res)
    busy_html = f"<div class='verdict warn'>{escape(busy)}</div>" if busy else ""
    return _section("bench", "Timing: eager vs compiled",
                    f"<table>{head}{''.join(rows)}</table>{note}{busy_html}{stats_html}")


def _charts(res: BenchResult) -> str:
    us = lambda v: f"{v:,.0f} µs" if v >= 10 else f"{v:.1f} µs"  # noqa: E731
    def pct(samples):   # x = how far through its own timed calls: the sides' counts differ
        pts = svg.downsample([v / 1e3 for v in samples])
        return [(x * 100 / max(len(samples) - 1, 1), y) for x, y in pts]
    series = [(f"eager ({len(res.eager_samples_ns):,} calls)", "#d9822b",
               pct(res.eager_samples_ns), False)]
    colors = ["#2f6fde", "#7b3fbf", "#1a9e8f"]
    for i, m in enumerate(res.modes):
        if m.ok and m.samples_ns:
            series.append((f"tempa [{m.mode}] ({len(m.samples_ns):,} calls)", colors[i % 3],
                           pct(m.samples_ns), False))
    # Scale to the typical calls of every series: one load spike must not flatten the rest.
    p90 = [sorted(y for _, y in pts)[int(len(pts) * 0.9)] for _, _, pts, _ in series if pts]
    y_max = max(p90) * 1.5 if p90 else None
    per_call = svg.line_chart(series, title="Per-call time, timed calls in order (spikes "
                              "above the chart are clipped)",
                              x_label="progress through the timed calls (%)",
                              y_label="µs per call", x_fmt=lambda v: f"{v:.0f}%", y_fmt=us,
                              y_max=y_max,
                              chart_id="chart-per-call")
    charts = [per_call]
    m = next((m for m in res.modes if m.ok and m.timing), None)
    if m is not None and m.first_call_cold_s is not None:
        e, c, f = res.eager.median_s, m.timing.median_s, m.first_call_cold_s
        be = m.break_even_calls
        n_max = (be * 2 if be else 10_000) or 10
        xs = [n_max * i / 50 for i in range(51)]
        tot = [("eager", "#d9822b", [(x, x * e) for x in xs], False),
               (f"tempa [{m.mode}], cold first call", "#2f6fde",
                [(x, f + max(x - 1, 0) * c) for x in xs], False)]
        if m.first_call_warm_s is not None:
            w = m.first_call_warm_s
            tot.append((f"tempa [{m.mode}], warm first call", "#2f6fde",
                        [(x, w + max(x - 1, 0) * c) for x in xs], True))
        marker = (be, f"break-even: {be:,} calls") if be else None
        pts = [(be, be * e, f"break-even at {be:,} calls")] if be else []
        yf = lambda v: fmt_time(v) if v else "0"  # noqa: E731
        charts.append(svg.line_chart(
            tot, title="Total time after n calls, compile time included"
            + ("" if be else " (cannot tell at this noise whether compiled catches up)"
               if m.verdict.startswith("cannot tell") else " (compiled never catches up)"),
            x_label="calls", y_label="total time", x_fmt=lambda v: f"{v:,.0f}", y_fmt=yf,
            marker=marker, points=pts, chart_id="chart-break-even"))
    return _section("charts", "Charts", "\n".join(charts))


def _graphs(ex: Explanation) -> str:
    head = (f"<p><b>{ex.graph_count}</b> graphs, <b>{ex.break_count}</b> graph breaks, "
            f"<b>{ex.op_count}</b> ops in graphs.</p>")
    if ex.error:
        head += f"<div class='verdict bad'>{escape(ex.error)}</div>"
    items = []
    for i, g in enumerate(ex.graphs, 1):
        name = "" if g.function.startswith("graph ") else f": {escape(g.function)}"
        items.append(f"<div class='card' data-item><h3>Graph {i} of {len(ex.graphs)}{name}"
                     f"<span class='tag'>{g.op_count} ops</span></h3>"
                     f"<details open><summary>captured FX code</summary>{_pre(g.code)}</details>"
                     "</div>")
    return _section("graphs", "Captured graphs",
                    head + ("\n".join(items) or _empty("No graph was captured.")))


def _source_block(b) -> str:
    lines = b.source(3)
    if not lines:
        return ""
    body = "".join(f"<span class='hit'>&gt; {n:4d} | {escape(text)}</span>" if mark else
                   f"  {n:4d} | {escape(text)}\n" for n, text, mark in lines)
    return f"<pre class='src'>{body}</pre>"


def _breaks(ex: Explanation) -> str:
    items = []
    for i, b in enumerate(ex.breaks, 1):
        items.append(f"<div class='card' data-item><h3>Break {i}: {escape(b.type)}"
                     f"<span class='tag bad'>{escape(b.where)}</span></h3>"
                     f"<p><b>Reason:</b> {escape(b.reason)}</p>{_source_block(b)}"
                     + (f"<p><b>Hint:</b> {escape(b.hint)}</p>" if b.hint else "") + "</div>")
    return _section("breaks", "Graph breaks",
                    "\n".join(items) or _empty("No graph breaks: the forward is one graph."))


def _guards(ex: Explanation) -> str:
    items = []
    for i, g in enumerate(ex.graphs, 1):
        if g.guards:
            lis = "".join(f"<li>{escape(d)}</li>" for d in g.guards)
            name = "" if g.function.startswith("graph ") else f": {escape(g.function)}"
            items.append(f"<div class='card' data-item><h3>Graph {i}{name}"
                         f"<span class='tag'>{len(g.guards)} guards</span></h3><ul>{lis}</ul>"
                         "</div>")
    return _section("guards", "Guards (what each compiled entry assumed)",
                    "\n".join(items) or _empty("No guards recorded."))


def _recompiles(ex: Explanation, res: BenchResult) -> str:
    """Recompiles of the explanation's own calls and of the timing runs: the same model
    can recompile while it is timed (a guard on a value that changes per call), and the
    page must not say "No recompiles" above a fallback that says "recompiled 8 times"."""
    rows = list(ex.recompiles)
    for m in res.modes:
        n = m.stats.get("recompiles", 0)
        if n:
            said = [msg for msg in m.fallback_messages if "recompil" in msg]
            rows.append(f"[{m.mode}] {n} recompiles while timing" +
                        (f": {said[0]}" if said else ""))
    items = "".join(f"<li data-item>{escape(r)}</li>" for r in rows)
    return _section("recompiles", "Recompiles",
                    f"<ul>{items}</ul>" if items else _empty(
                        "No recompiles. (Add `extra_inputs` to the model file to try other "
                        "shapes, e.g. batch 9 after batch 8.)"))


def _fallbacks(ex: Explanation, res: BenchResult) -> str:
    msgs = list(ex.eager_fallbacks)
    stance = [f"[explain] {d}" for d in ex.stance]    # choices, not fallbacks: not counted
    for m in res.modes:
        for msg in m.fallback_messages:
            if "stance auto:" in msg:
                stance.append(f"[{m.mode}] {msg}")
            elif msg not in msgs:
                msgs.append(f"[{m.mode}] {msg}")
    items = "".join(f"<li data-item>{escape(x)}</li>" for x in msgs)
    notes = "".join(f"<li>{escape(x)}</li>" for x in ex.notes)
    inner = f"<ul>{items}</ul>" if items else _empty("None: everything captured ran compiled.")
    if stance:
        inner += "<h3>Stance auto: what each function kept</h3><ul>" + "".join(
            f"<li>{escape(x)}</li>" for x in stance) + "</ul>"
    if notes:
        inner += f"<h3>Notes</h3><ul>{notes}</ul>"
    return _section("fallbacks", "Eager fallbacks and warnings", inner)


def _kernels(generated: list[GraphInfo], res: BenchResult) -> str:
    failed = [m for m in res.modes if not m.ok]
    items = [f"<div class='verdict bad' data-item>[{escape(m.mode)}] compiling failed: "
             f"{escape(m.error or '?')}</div>" for m in failed]
    for i, g in enumerate(generated, 1):
        tags = "".join(
            f"<span class='tag {cls}'>{escape(t)}</span>" for t, cls in (
                (g.backend or "?", "bad" if g.fallback_reason else ""),
                (f"{g.kernel_count} kernels" if g.kernel_count is not None else "", ""),
                ("from disk cache" if g.from_disk_cache else "", "good"),
                ("gcc ran" if g.used_gcc else "", ""),
                (f"compiled in {fmt_time(g.compile_seconds)}" if g.compile_seconds else "", ""))
            if t)
        parts = [f"<div class='card' data-item><h3>Entry {i}: {escape(g.function)}{tags}</h3>"]
        if g.fallback_reason:
            parts.append(f"<p><b>Ran eagerly:</b> {escape(str(g.fallback_reason))}</p>")
        if g.cpp_source:
            parts.append(f"<details><summary>generated C++ ({len(g.cpp_source.splitlines())} "
                         f"lines)</summary>{_pre(g.cpp_source)}</details>")
        if g.triton_source:
            parts.append(f"<details><summary>generated Triton</summary>"
                         f"{_pre(g.triton_source)}</details>")
        for name, src in g.variants.items():
            parts.append(f"<details><summary>generated C++, {escape(name)} variant</summary>"
                         f"{_pre(src)}</details>")
        if g.wrapper_source:
            parts.append(f"<details><summary>wrapper (Python)</summary>"
                         f"{_pre(g.wrapper_source)}</details>")
        if g.fusion_report:
            parts.append(f"<details open><summary>fusion decisions</summary>"
                         f"{_pre(g.fusion_report)}</details>")
        if g.aten_fallbacks:
            parts.append("<p><b>ATen fallbacks</b> (ops run as library calls, not generated "
                         "code): " + escape(", ".join(g.aten_fallbacks)) + "</p>")
        if g.extern_calls:
            parts.append("<p><b>Extern calls</b> (tuned libraries): "
                         + escape(", ".join(g.extern_calls)) + "</p>")
        for n in g.notes:
            parts.append(f"<p class='muted'>{escape(n)}</p>")
        if not (g.cpp_source or g.triton_source or g.wrapper_source or g.fallback_reason):
            parts.append(_empty("The backend produced no generated code for this graph "
                                f"({g.backend or 'no backend information'})."))
        parts.append("</div>")
        items.append("".join(parts))
    if not items:
        items.append(_empty("No compiled entries (the model ran eagerly)."))
    toggle = " <button class='toggle' type='button'>expand all</button>"
    return _section("kernels", "Generated code: kernels, wrapper, fusion", "\n".join(items),
                    extra=toggle)


def _environment(res: BenchResult) -> str:
    rows = "".join(f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>"
                   for k, v in res.environment.items())
    return _section("environment", "Environment", f"<table class='kv'>{rows}</table>")
