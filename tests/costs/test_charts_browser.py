"""The cost pages' charts in a real browser (Chromium): uPlot loads from our static files and draws."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from tests.browser import page  # noqa: F401  (fixture)
from tests.costs.test_drain import SACCT
from tests.costs.test_pages import NODES_CSV
from tests.costs.test_simulate import TRACE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_drain_and_simulator_pages_draw_their_charts(page, live_server):  # noqa: F811
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
    page.wait_for_selector("[data-chart='drain-chart-1'][data-rendered='true'] canvas", timeout=10_000)
    assert "Before the window of 2025-03-10 08:00 UTC" in page.inner_text("main")

    page.goto(f"{live_server.url}/costs/simulate/")
    page.set_input_files("input[name=fleet_file]", files=[
        {"name": "nodes.csv", "mimeType": "text/csv", "buffer": NODES_CSV.encode()}])
    page.set_input_files("input[name=trace_file]", files=[
        {"name": "pods.csv", "mimeType": "text/csv", "buffer": TRACE.encode()}])
    page.fill("input[name=release]", "10")
    page.fill("input[name=p_parallelism]", "1")
    page.click("button:has-text('Simulate')")
    page.wait_for_selector("[data-chart='sim-patched'][data-rendered='true'] canvas", timeout=10_000)
    page.wait_for_selector("[data-chart='sim-exposure'][data-rendered='true'] canvas", timeout=10_000)
    assert page.locator("#sim-table tr").count() == 5  # a header; two window cadences, one k for the others
    assert failed == []  # nothing fetched from anywhere but the server, and nothing missing
