"""The SVG charts keep their rules: axes from 0, grouped bars, a baseline as a line, labels that fit."""

from __future__ import annotations

import re

from costs import charts


def test_bars_are_grouped_from_zero_and_the_baseline_is_a_line():
    chart = charts.bars("c", "t", "GPU-hours", ["a", "b"], [("one", [3.0, 7.0]), ("two", [5.0, 1.0])],
                        baseline=("baseline day", 4.0))
    rects = re.findall(r'<rect data-series="(\w+)" x="([\d.]+)"', chart.svg)
    assert [name for name, _x in rects] == ["one", "one", "two", "two"]
    xs = {name: [float(x) for n, x in rects if n == name] for name in ("one", "two")}
    assert all(a < b for a, b in zip(xs["one"], xs["two"], strict=True))  # side by side, not on top
    assert '<line data-series="baseline day"' in chart.svg and 'rect data-series="baseline day"' not in chart.svg
    assert ">0</text>" in chart.svg and ">10</text>" in chart.svg  # the axis: 0 to a round top
    assert [label for label, _c in chart.legend] == ["one", "two", "baseline day"]


def test_long_category_labels_are_turned_upright_and_shortened():
    many = [f"checkpoint-migrate sweep {k}%" for k in range(12)]
    chart = charts.bars("c", "t", "node-days", many, [("x", [1.0] * 12)])
    assert len(re.findall(r'class="category" transform="rotate\(-90', chart.svg)) == 12
    assert "checkpoint-migrat…" in chart.svg and f"<title>{many[0]}</title>" in chart.svg
    few = charts.bars("c", "t", "node-days", ["1%", "5%"], [("x", [1.0, 2.0])])
    assert not re.search(r'class="category" transform', few.svg)


def test_a_curve_without_points_is_still_drawn():
    chart = charts.steps("s", "t", "share", "days", [("done", [(1.0, 0.5), (2.0, 1.0)]), ("never", [])], ytop=1.0)
    assert 'data-series="never"' in chart.svg and [label for label, _c in chart.legend] == ["done", "never"]


def test_nice_max_rounds_up():
    assert [charts.nice_max(v) for v in (0, 0.3, 7, 12, 240, 2600)] == [1.0, 0.5, 10, 20, 250, 5000]
