"""The cost pages' charts in a real browser (Chromium), at 1280 and 390 px: each chart is drawn,
none of its labels run into another or out of the chart, and every series of its legend has a mark.
Screenshots of each chart go to pytest's tmp_path (and to GPUSWEEP_SCREENSHOTS when set)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User

from tests.browser import page  # noqa: F401  (fixture)
from tests.costs.test_drain import SACCT
from tests.costs.test_pages import NODES_CSV
from tests.costs.test_simulate import TRACE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WIDTHS = (1280, 390)

# For every figure: its text boxes (which must not overlap, nor leave the svg), its legend's series
# and, per series, the size of its marks (a series without a visible mark is missing).
INSPECT = """() => [...document.querySelectorAll("figure[data-chart]")].map(figure => {
  const svg = figure.querySelector("svg").getBoundingClientRect();
  const texts = [...figure.querySelectorAll("svg text")].map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom};
  });
  const legend = [...figure.querySelectorAll("ul.legend li")].map(li => li.dataset.series);
  const marks = {};
  for (const mark of figure.querySelectorAll("svg [data-series]")) {
    const r = mark.getBoundingClientRect();
    marks[mark.dataset.series] = Math.max(marks[mark.dataset.series] || 0, r.width + r.height);
  }
  return {id: figure.dataset.chart, svg: {l: svg.left, r: svg.right, t: svg.top, b: svg.bottom},
          texts, legend, marks, legendBottom: figure.querySelector("ul.legend").getBoundingClientRect().right};
})"""


def _overlap(a: dict, b: dict) -> float:
    return max(0.0, min(a["r"], b["r"]) - max(a["l"], b["l"])) * max(0.0, min(a["b"], b["b"]) - max(a["t"], b["t"]))


def _check(page, width: int, folder: Path, expected: set[str]) -> None:  # noqa: F811
    page.set_viewport_size({"width": width, "height": 900})
    figures = page.evaluate(INSPECT)
    assert expected <= {f["id"] for f in figures}
    for figure in figures:
        shot = folder / f"{figure['id']}-{width}.png"
        page.locator(f"figure[data-chart='{figure['id']}']").screenshot(path=str(shot))
        texts = [t for t in figure["texts"] if t["text"].strip()]
        for i, a in enumerate(texts):
            inside = (a["l"] >= figure["svg"]["l"] - 1 and a["r"] <= figure["svg"]["r"] + 1
                      and a["t"] >= figure["svg"]["t"] - 1 and a["b"] <= figure["svg"]["b"] + 1)
            assert inside, f"{figure['id']} at {width} px: {a['text']!r} leaves the chart"
            for b in texts[i + 1:]:
                assert _overlap(a, b) < 1, f"{figure['id']} at {width} px: {a['text']!r} runs into {b['text']!r}"
        assert figure["legend"], f"{figure['id']}: no legend"
        for series in figure["legend"]:
            assert figure["marks"].get(series, 0) > 0, f"{figure['id']} at {width} px: series {series!r} is missing"
        assert figure["legendBottom"] <= width, f"{figure['id']} at {width} px: the legend is wider than the page"


def test_the_cost_charts_read_at_1280_and_390_px(page, live_server, tmp_path):  # noqa: F811
    folder = Path(os.environ.get("GPUSWEEP_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    user = User.objects.create_user("vera", password="pw-vera-12345")
    user.groups.add(Group.objects.get(name="viewer"))
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.goto(f"{live_server.url}/costs/drain/")
    page.fill("input[name=username]", "vera")
    page.fill("input[name=password]", "pw-vera-12345")
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('What a maintenance window costs')")
    page.set_input_files("input[name=sacct]", files=[
        {"name": "sacct.txt", "mimeType": "text/plain", "buffer": SACCT.encode()}])
    page.fill("textarea[name=windows]", "2025-03-10T08:00")
    page.fill("input[name=days]", "2")
    page.click("button:has-text('Measure')")
    page.wait_for_selector("figure[data-chart='drain-chart-1'] svg")
    for width in WIDTHS:
        _check(page, width, folder, {"drain-chart-1", "drain-submissions-1"})

    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{live_server.url}/costs/simulate/")
    page.set_input_files("input[name=fleet_file]", files=[
        {"name": "nodes.csv", "mimeType": "text/csv", "buffer": NODES_CSV.encode()}])
    page.set_input_files("input[name=trace_file]", files=[
        {"name": "pods.csv", "mimeType": "text/csv", "buffer": TRACE.encode()}])
    page.fill("input[name=release]", "10")
    page.fill("input[name=p_parallelism]", "1,2")
    page.check("input[name=sensitivity]")
    page.click("button:has-text('Simulate')")
    page.wait_for_selector("figure[data-chart='sim-patched'] svg")
    assert page.locator("#sim-table tr").count() == 7  # a header; two window cadences, two k for the others
    for width in WIDTHS:
        _check(page, width, folder, {"sim-patched", "sim-exposure", "sim-gpu-hours", "sim-utilization",
                                     "sens-parallelism", "sens-cadences", "sens-checkpointable_share",
                                     "sens-wait_limit_h"})
    assert failed == []  # nothing fetched from anywhere but the server, and nothing missing
