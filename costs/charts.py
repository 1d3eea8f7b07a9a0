"""The cost pages' charts as SVG drawn on the server: readable without JavaScript, checkable in tests.

Rules every chart keeps (issue 32): one unit per y axis (two units make two charts), the y axis
from 0, bars of one category side by side (grouped, never stacked or drawn over each other), a
constant (a baseline) as a line, not as bars, every series in the legend (an HTML list that wraps
on a narrow screen) and drawn with a mark tagged `data-series`, and category labels that fit: they
are turned when they would run into each other, and shortened past `MAX_LABEL` characters (the
full text in a tooltip).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from django.utils.html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f")
WIDTH, HEIGHT = 640, 300
LEFT, RIGHT, TOP = 64, 16, 12
CHAR_W = 6.2  # width of a character at font-size 11, roughly (labels are sized by it)
MAX_LABEL = 18


@dataclass
class Chart:
    id: str
    title: str
    ylabel: str  # the one unit of the y axis
    xlabel: str
    svg: str = ""
    legend: list[tuple[str, str]] = field(default_factory=list)  # (label, color)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "svg": self.svg, "legend": self.legend}


def nice_max(value: float) -> float:
    """A round top for an axis from 0 (1, 2, 2.5 or 5 times a power of ten), at least `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:,.2g}"


def _frame(chart: Chart, top: float, bottom: float, ticks: int = 5) -> list[str]:
    """The y axis from 0 to `top`, its grid, its unit; the plot area ends `bottom` px from the foot."""
    plot_h = HEIGHT - TOP - bottom
    parts: list[str] = []  # the title is the figure's caption (HTML, so it wraps on a narrow screen)
    for k in range(ticks + 1):
        value = top * k / ticks
        y = TOP + plot_h * (1 - k / ticks)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" class="tick">'
                     f'{_number(value)}</text>')
    parts.append(f'<text transform="translate(14,{TOP + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle" '
                 f'font-size="11" class="unit">{escape(chart.ylabel)}</text>')
    parts.append(f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#333"/>')
    parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" stroke="#333"/>')
    return parts


def _svg(chart: Chart, parts: list[str]) -> str:
    return (f'<svg class="cost-chart" id="{escape(chart.id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(chart.title)}" preserveAspectRatio="xMinYMin meet" '
            f'style="width:100%;height:auto;max-width:{WIDTH * 1.4:.0f}px">{"".join(parts)}</svg>')


def bars(chart_id: str, title: str, ylabel: str, categories: list[str], series: list[tuple[str, list[float]]],
         xlabel: str = "", baseline: tuple[str, float] | None = None) -> Chart:
    """Grouped bars, one group per category; `baseline` (label, value) is drawn as a dashed line."""
    chart = Chart(id=chart_id, title=title, ylabel=ylabel, xlabel=xlabel)
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(categories))
    labels = [_short(c) for c in categories]
    turned = max((len(t) for t in labels), default=0) * CHAR_W > slot - 4
    bottom = 24 + (max((len(t) for t in labels), default=0) * CHAR_W if turned else 0) + (14 if xlabel else 0)
    values = [v for _label, vs in series for v in vs] + ([baseline[1]] if baseline else [])
    top = nice_max(max(values, default=0.0))
    plot_h = HEIGHT - TOP - bottom
    parts = _frame(chart, top, bottom)
    width = slot * 0.8 / max(1, len(series))
    for s, (label, vs) in enumerate(series):
        color = COLORS[s % len(COLORS)]
        chart.legend.append((label, color))
        for i, value in enumerate(vs):
            h = plot_h * max(0.0, value) / top
            x = LEFT + slot * i + slot * 0.1 + width * s
            parts.append(f'<rect data-series="{escape(label)}" x="{x:.1f}" y="{TOP + plot_h - h:.1f}" '
                         f'width="{max(width - 1, 1):.1f}" height="{max(h, 0.5):.1f}" fill="{color}">'
                         f'<title>{escape(categories[i])}: {escape(label)} {value:,.2f}</title></rect>')
    if baseline is not None:
        color = COLORS[len(series) % len(COLORS)]
        chart.legend.append((baseline[0], color))
        y = TOP + plot_h * (1 - baseline[1] / top)
        parts.append(f'<line data-series="{escape(baseline[0])}" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
                     f'y2="{y:.1f}" stroke="{color}" stroke-width="2" stroke-dasharray="6 4"/>')
    for i, text in enumerate(labels):
        x, y = LEFT + slot * (i + 0.5), TOP + plot_h + 14
        # Turned upright (-90 degrees): a label then takes a slot one line wide, whatever its length.
        turn = (f' transform="rotate(-90 {x + 4:.1f} {y - 6:.1f})" x="{x + 4:.1f}" y="{y - 6:.1f}" text-anchor="end"'
                if turned else f' x="{x:.1f}" y="{y:.1f}" text-anchor="middle"')
        parts.append(f'<text font-size="11" class="category"{turn}>{escape(text)}'
                     f'<title>{escape(categories[i])}</title></text>')
    if xlabel:
        parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle" '
                     f'font-size="11" class="unit">{escape(xlabel)}</text>')
    chart.svg = _svg(chart, parts)
    return chart


def steps(chart_id: str, title: str, ylabel: str, xlabel: str, curves: list[tuple[str, list[tuple[float, float]]]],
          ytop: float | None = None) -> Chart:
    """Step lines from (0, 0): each curve rises at its points. Every curve is in the legend; one
    with no point (nothing happened) is drawn along the foot, so it is still there."""
    chart = Chart(id=chart_id, title=title, ylabel=ylabel, xlabel=xlabel)
    bottom = 38
    right = max((p[0] for _l, pts in curves for p in pts), default=0.0)
    xtop = nice_max(right)
    top = ytop if ytop is not None else nice_max(max((p[1] for _l, pts in curves for p in pts), default=0.0))
    plot_h, plot_w = HEIGHT - TOP - bottom, WIDTH - LEFT - RIGHT
    parts = _frame(chart, top, bottom)
    for k in range(6):
        x = LEFT + plot_w * k / 5
        parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" font-size="11" class="tick">'
                     f'{_number(xtop * k / 5)}</text>')
    parts.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="11" '
                 f'class="unit">{escape(xlabel)}</text>')
    for c, (label, points) in enumerate(curves):
        color = COLORS[c % len(COLORS)]
        chart.legend.append((label, color))
        path = [f"M{LEFT:.1f},{TOP + plot_h:.1f}"]
        for px, py in [*points, (xtop, points[-1][1] if points else 0.0)]:
            path.append(f"H{LEFT + plot_w * px / xtop:.1f}V{TOP + plot_h * (1 - py / top):.1f}")
        # Earlier curves wider: where curves coincide, each still shows as a band of its colour.
        width = 2 + min(8.0, 1.5 * (len(curves) - 1 - c))
        parts.append(f'<path data-series="{escape(label)}" d="{"".join(path)}" fill="none" stroke="{color}" '
                     f'stroke-width="{width:g}" stroke-linejoin="round"/>')
    chart.svg = _svg(chart, parts)
    return chart
