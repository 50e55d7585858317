"""Small self-contained SVG line plots (log or linear axes) for the drift reports.

Oracle: the SVG 1.1 text itself; no plotting library.  Data map to pixels by
``x_px = left + (f(x) - f(lo)) / (f(hi) - f(lo)) * width`` with ``f = log10`` on log axes;
non-positive values on a log axis and non-finite values are dropped from a series (never drawn
as zero).  Output is deterministic text (fixed 1-decimal pixel coordinates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22")


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float]
    color: str = "#1f77b4"
    style: str = "line"  # "line", "dashed", "markers", "line+markers", "hline"
    width: float = 1.6
    legend: bool = True


@dataclass
class Plot:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    logx: bool = True
    logy: bool = True
    width: int = 470
    height: int = 300
    note: str = ""


def _finite_pos(v: float, log: bool) -> bool:
    return v is not None and math.isfinite(v) and (v > 0 or not log)


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        step = max(1, math.ceil((b - a) / 7))
        return [10.0**k for k in range(a, b + 1, step)]
    span = hi - lo
    raw = span / 5 if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def _tick_label(v: float, log: bool) -> str:
    if log:
        k = round(math.log10(v))
        if -2 <= k <= 3:
            return escape(f"{v:g}")
        return f'10<tspan dy="-5" font-size="8">{k}</tspan>'
    return escape(f"{v:g}")


def render(plot: Plot, uid: str = "p") -> str:
    """The plot as an ``<svg>`` element (a string); ``uid`` makes its clip-path id unique in a page."""
    W, H = plot.width, plot.height
    legend_items = [s for s in plot.series if s.legend]
    L, R, T = 62, 12, 26
    ncol = 2 if W >= 440 else 1
    rows = math.ceil(len(legend_items) / ncol)
    B = 44 + 14 * rows
    pw, ph = W - L - R, H - T - B
    xs = [x for s in plot.series if s.style != "hline" for x, y in zip(s.x, s.y)
          if _finite_pos(x, plot.logx) and _finite_pos(y, plot.logy)]
    ys = [y for s in plot.series for x, y in zip(s.x, s.y)
          if _finite_pos(y, plot.logy) and (s.style == "hline" or _finite_pos(x, plot.logx))]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'font-family="Helvetica, Arial, sans-serif" font-size="10" role="img">',
           f'<title>{escape(plot.title)}</title>',
           f'<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>',
           f'<text x="{W / 2:.1f}" y="16" text-anchor="middle" font-size="12" font-weight="bold">'
           f'{escape(plot.title)}</text>']
    if not xs or not ys:
        out.append(f'<text x="{W / 2:.1f}" y="{H / 2:.1f}" text-anchor="middle" fill="#777">no finite data'
                   f'{(" (" + escape(plot.note) + ")") if plot.note else ""}</text></svg>')
        return "\n".join(out)
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = min(ys), max(ys)
    if plot.logx:
        xlo, xhi = 10 ** math.floor(math.log10(xlo)), 10 ** math.ceil(math.log10(xhi) + 1e-12)
    if plot.logy:
        ylo, yhi = 10 ** math.floor(math.log10(ylo)), 10 ** math.ceil(math.log10(yhi) + 1e-12)
    else:
        pad = (yhi - ylo) * 0.05 or abs(yhi) * 0.05 or 1.0
        ylo, yhi = ylo - pad, yhi + pad
    if xhi == xlo:
        xhi = xlo * 10 if plot.logx else xlo + 1
    if yhi == ylo:
        yhi = ylo * 10 if plot.logy else ylo + 1
    fx = (lambda v: math.log10(v)) if plot.logx else (lambda v: v)
    fy = (lambda v: math.log10(v)) if plot.logy else (lambda v: v)
    px = lambda v: L + (fx(v) - fx(xlo)) / (fx(xhi) - fx(xlo)) * pw
    py = lambda v: T + ph - (fy(v) - fy(ylo)) / (fy(yhi) - fy(ylo)) * ph
    out.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#999"/>')
    for v in _ticks(xlo, xhi, plot.logx):
        if xlo <= v <= xhi * (1 + 1e-9):
            x = px(v)
            out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{T + ph}" stroke="#e3e3e3"/>')
            out.append(f'<text x="{x:.1f}" y="{T + ph + 13}" text-anchor="middle">{_tick_label(v, plot.logx)}</text>')
    for v in _ticks(ylo, yhi, plot.logy):
        if ylo <= v <= yhi * (1 + 1e-9):
            y = py(v)
            out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#e3e3e3"/>')
            out.append(f'<text x="{L - 4}" y="{y + 3:.1f}" text-anchor="end">{_tick_label(v, plot.logy)}</text>')
    out.append(f'<text x="{L + pw / 2:.1f}" y="{T + ph + 28}" text-anchor="middle">{escape(plot.xlabel)}</text>')
    out.append(f'<text x="12" y="{T + ph / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {T + ph / 2:.1f})">{escape(plot.ylabel)}</text>')
    out.append(f'<clipPath id="clip-{uid}"><rect x="{L}" y="{T}" width="{pw}" height="{ph}"/></clipPath>')
    out.append(f'<g clip-path="url(#clip-{uid})">')
    for s in plot.series:
        pts = [(px(x), py(y)) for x, y in zip(s.x, s.y)
               if _finite_pos(y, plot.logy) and (s.style == "hline" or _finite_pos(x, plot.logx))]
        if s.style == "hline":
            for _, y in pts[:1]:
                out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="{s.color}" '
                           f'stroke-width="{s.width}" stroke-dasharray="6 3"/>')
            continue
        if "line" in s.style or s.style == "dashed":
            if len(pts) > 1:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
                dash = ' stroke-dasharray="5 3"' if s.style == "dashed" else ""
                out.append(f'<polyline points="{d}" fill="none" stroke="{s.color}" stroke-width="{s.width}"{dash}/>')
        if "markers" in s.style:
            for x, y in pts:
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{s.color}"/>')
    out.append("</g>")
    for i, s in enumerate(legend_items):
        col, row = i % ncol, i // ncol
        x = L + col * (pw / ncol)
        y = T + ph + 46 + row * 14
        dash = ' stroke-dasharray="5 3"' if s.style in ("dashed", "hline") else ""
        if "markers" in s.style and "line" not in s.style:
            out.append(f'<circle cx="{x + 9:.1f}" cy="{y - 3:.1f}" r="2.5" fill="{s.color}"/>')
        else:
            out.append(f'<line x1="{x:.1f}" y1="{y - 3:.1f}" x2="{x + 18:.1f}" y2="{y - 3:.1f}" stroke="{s.color}" '
                       f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 23:.1f}" y="{y:.1f}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


__all__ = ["PALETTE", "Plot", "Series", "render"]
