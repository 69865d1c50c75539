"""Line plots of benchmark rows as self-contained SVG (no plotting library needed).

``line_plot(rows, x="L", ys=["ours_us", "sdpa_us"], by=["heads", "B"])`` draws one panel per
distinct value of the ``by`` columns, one line per ``ys`` column, ``x`` on the horizontal axis
(log scale by default: the benchmarks sweep lengths and sizes in powers of two). A row missing a
value, or holding NaN / None / a non-positive value on a log axis, is left out of that line.
``flashrt plot`` runs it on a results JSON; ``write_plots`` (``flashrt bench``) writes one for
each plot a benchmark registers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")
PANEL_W, PANEL_H, PAD_L, PAD_B, PAD_T, PAD_R = 300, 210, 58, 36, 26, 12


def _matches(value: Any, want: str) -> bool:
    text = str(value)
    return text.startswith(want[:-1]) if want.endswith("*") else text == want


def select(rows: Sequence[dict[str, Any]], where: dict[str, str]) -> list[dict[str, Any]]:
    """The rows whose columns match ``where``'s values, compared as text (``B=4`` matches 4); a
    value ending in ``*`` matches as a prefix (``case=tree*``)."""
    return [r for r in rows if all(_matches(r.get(k), v) for k, v in where.items())]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _scale(lo: float, hi: float, log: bool):
    """value -> [0, 1] and the tick values of an axis covering ``[lo, hi]``."""
    if log:
        a, b = math.log2(lo), math.log2(hi)
        if b - a < 1e-9:
            a, b = a - 0.5, b + 0.5
        a, b = a - 0.04 * (b - a), b + 0.04 * (b - a)  # the extreme points off the frame
        step = max(1, math.ceil((b - a) / 6))
        ticks = [2.0**e for e in range(math.ceil(a), math.floor(b) + 1, step)]
        return (lambda v: (math.log2(v) - a) / (b - a)), ticks
    if hi - lo < 1e-12:
        lo, hi = lo - 1.0, hi + 1.0
    lo, hi = lo - 0.04 * (hi - lo), hi + 0.04 * (hi - lo)
    raw = (hi - lo) / 5
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if m * step >= raw)
    ticks = [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]
    return (lambda v: (v - lo) / (hi - lo)), ticks


def _label(v: float) -> str:
    if v >= 1024 and v == int(v) and int(v) % 1024 == 0:
        return f"{int(v) // 1024}k"
    return f"{v:.3g}"


def _panel(lines, name, x, ox, oy, log_x, log_y) -> list[str]:
    """One panel's SVG elements at ``(ox, oy)``: ``lines[i]`` drawn in ``COLORS[i]``."""
    pts = [p for line in lines for p in line]
    fx, xticks = _scale(min(p[0] for p in pts), max(p[0] for p in pts), log_x)
    fy, yticks = _scale(min(p[1] for p in pts), max(p[1] for p in pts), log_y)
    x0, x1 = ox + PAD_L, ox + PANEL_W - PAD_R
    y0, y1 = oy + PANEL_H - PAD_B, oy + PAD_T
    sx = lambda v: x0 + fx(v) * (x1 - x0)  # noqa: E731
    sy = lambda v: y0 - fy(v) * (y0 - y1)  # noqa: E731
    out = [
        f'<text x="{(x0 + x1) / 2}" y="{oy + 15}" text-anchor="middle">{escape(name)}</text>',
        f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" stroke="#999"/>',
        f'<text x="{(x0 + x1) / 2}" y="{y0 + 29}" text-anchor="middle">{escape(x)}</text>',
    ]
    out += [
        f'<text x="{sx(t):.1f}" y="{y0 + 14}" text-anchor="middle">{_label(t)}</text>'
        for t in xticks
    ]
    out += [
        f'<line x1="{x0}" y1="{sy(t):.1f}" x2="{x1}" y2="{sy(t):.1f}" stroke="#eee"/>'
        f'<text x="{x0 - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_label(t)}</text>'
        for t in yticks
    ]
    for i, line in enumerate(lines):
        color = COLORS[i % len(COLORS)]
        if len(line) > 1:
            xy = " ".join(f"{sx(px):.1f},{sy(py):.1f}" for px, py in line)
            out.append(f'<polyline points="{xy}" fill="none" stroke="{color}" stroke-width="2"/>')
        out += [
            f'<circle cx="{sx(px):.1f}" cy="{sy(py):.1f}" r="2.5" fill="{color}"/>'
            for px, py in line
        ]
    return out


def line_plot(rows: Sequence[dict[str, Any]], x: str, ys: Sequence[str], by: Sequence[str] = (),
              *, log_x: bool = True, log_y: bool = True, title: str = "",
              columns: int = 4) -> str:  # fmt: skip
    """The SVG text (see the module docstring). Raises ``ValueError`` naming what is missing
    when no row has a plottable ``x`` and one of ``ys``."""
    if not ys:
        raise ValueError("line_plot: name at least one y column")
    ok = lambda v, log: v is not None and (v > 0 or not log)  # noqa: E731
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(c) for c in by), []).append(r)
    series = {}  # (group, y) -> sorted points
    for g, members in groups.items():
        for y in ys:
            pts = [(_number(r.get(x)), _number(r.get(y))) for r in members]
            pts = sorted((px, py) for px, py in pts if ok(px, log_x) and ok(py, log_y))
            if pts:
                series[g, y] = pts
    if not series:
        have = sorted({k for r in rows for k in r})
        raise ValueError(f"line_plot: no row has a plottable {x!r} and one of {list(ys)} "
                         f"({len(rows)} rows; columns: {have})")  # fmt: skip
    panels = [g for g in groups if any((g, y) in series for y in ys)]
    ncol = min(columns, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    legend_h = 22
    top = (24 if title else 0) + legend_h
    width, height = ncol * PANEL_W, top + nrow * PANEL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']  # fmt: skip
    if title:
        out.append(f'<text x="{width / 2}" y="17" text-anchor="middle" font-size="14">'
                   f"{escape(title)}</text>")  # fmt: skip
    for i, y in enumerate(ys):
        lx = 10 + i * 150
        out.append(f'<line x1="{lx}" y1="{top - 11}" x2="{lx + 18}" y2="{top - 11}" '
                   f'stroke="{COLORS[i % len(COLORS)]}" stroke-width="2"/>'
                   f'<text x="{lx + 22}" y="{top - 7}">{escape(y)}</text>')  # fmt: skip
    for n, g in enumerate(panels):
        name = ", ".join(f"{c}={v}" for c, v in zip(by, g, strict=True))
        lines = [series.get((g, y), []) for y in ys]
        out += _panel(lines, name, x, (n % ncol) * PANEL_W, top + (n // ncol) * PANEL_H,
                      log_x, log_y)  # fmt: skip
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_plots(bench, rows, out_dir) -> list[Path]:
    """``<benchmark>-<plot>.svg`` for each of the benchmark's registered plots that has rows."""
    written = []
    for name, spec in bench.plots.items():
        spec = dict(spec)
        chosen = select(rows, spec.pop("where", {}))
        try:
            svg = line_plot(chosen, title=f"{bench.name}: {name}", **spec)
        except ValueError as err:  # e.g. --quick left out every row of this plot
            print(f"no plot {name}: {err}")
            continue
        path = Path(out_dir) / f"{bench.name}-{name}.svg"
        path.write_text(svg)
        written.append(path)
    return written
