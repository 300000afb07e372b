"""Inline SVG line charts for the report: no library, no network, readable in any browser.

One function, ``line_chart``, draws several series on shared linear axes with "nice" tick
values, an optional vertical marker (the break-even point) and a legend.
"""
from __future__ import annotations

import math
from html import escape


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks


def downsample(values: list[float], buckets: int = 300) -> list[tuple[float, float]]:
    """(index, median of the bucket) points: a 20,000-sample series stays a small path."""
    n = len(values)
    if n <= buckets:
        return [(i, v) for i, v in enumerate(values)]
    out = []
    size = n / buckets
    for b in range(buckets):
        chunk = sorted(values[int(b * size): max(int((b + 1) * size), int(b * size) + 1)])
        out.append((b * size + len(chunk) / 2, chunk[len(chunk) // 2]))
    return out


def line_chart(series, *, title: str, x_label: str, y_label: str, x_fmt=str, y_fmt=str,
               y_max: float | None = None, marker: tuple[float, str] | None = None,
               points: list[tuple[float, float, str]] = (), width: int = 760,
               height: int = 300, chart_id: str = "") -> str:
    """``series``: list of (label, css color, [(x, y)...], dashed)."""
    left, right, top, bottom = 78, 20, 52, 48
    pw, ph = width - left - right, height - top - bottom
    xs = [x for _, _, pts, _ in series for x, _ in pts] or [0, 1]
    ys = [y for _, _, pts, _ in series for _, y in pts] or [0, 1]
    x0, x1 = min(xs + [0]), max(xs + [1])
    if marker:
        x1 = max(x1, marker[0])
    y1 = y_max if y_max is not None else max(ys) * 1.08 or 1
    xt, yt = nice_ticks(x0, x1), nice_ticks(0, y1)
    x1, y1 = max(x1, xt[-1]), max(y1, yt[-1])
    sx = lambda x: left + (x - x0) / ((x1 - x0) or 1) * pw  # noqa: E731
    sy = lambda y: top + ph - min(y, y1) / (y1 or 1) * ph   # noqa: E731

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" '
         f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
         f'aria-label="{escape(title)}">',
         f'<text x="{left}" y="20" class="ctitle">{escape(title)}</text>']
    for t in yt:
        y = sy(t)
        o.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        o.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
                 f'{escape(y_fmt(t))}</text>')
    for t in xt:
        x = sx(t)
        o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + ph}" y2="{top + ph + 4}" '
                 'class="axis"/>')
        o.append(f'<text x="{x:.1f}" y="{top + ph + 18}" class="tick" text-anchor="middle">'
                 f'{escape(x_fmt(t))}</text>')
    o.append(f'<line x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}" class="axis"/>')
    o.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}" class="axis"/>')
    o.append(f'<text x="{left + pw / 2}" y="{height - 8}" class="alabel" '
             f'text-anchor="middle">{escape(x_label)}</text>')
    o.append(f'<text x="14" y="{top + ph / 2}" class="alabel" text-anchor="middle" '
             f'transform="rotate(-90 14 {top + ph / 2})">{escape(y_label)}</text>')
    if marker:
        x = sx(marker[0])
        o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" class="marker"/>')
        anchor = "end" if x > left + pw * 0.7 else "start"
        dx = -6 if anchor == "end" else 6
        o.append(f'<text x="{x + dx:.1f}" y="{top + 14}" class="mlabel" '
                 f'text-anchor="{anchor}">{escape(marker[1])}</text>')
    for label, color, pts, dashed in series:
        if not pts:
            continue
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        o.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8"{dash} '
                 f'points="{d}"><title>{escape(label)}</title></polyline>')
    for x, y, label in points:
        o.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4.5" class="dot">'
                 f'<title>{escape(label)}</title></circle>')
    lx = left   # the legend: one row under the title, above the plot
    for label, color, _pts, dashed in series:
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        o.append(f'<line x1="{lx}" x2="{lx + 22}" y1="38" y2="38" stroke="{color}" '
                 f'stroke-width="2.5"{dash}/>')
        o.append(f'<text x="{lx + 27}" y="42" class="legend">{escape(label)}</text>')
        lx += 40 + 7 * len(label)
    o.append("</svg>")
    return "\n".join(o)
