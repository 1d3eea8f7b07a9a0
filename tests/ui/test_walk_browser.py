"""A new user's walk through the console in a real browser (Debian's Chromium through Playwright):
log in, open an advisory, plan a campaign from it in the wizard, approve it as a second person,
start it and watch the live board reach Completed with no reload, then download the PDF report.

The fleet is a small demo fleet on the memory executor (the test double of executors/memory.py,
each operation taking 0.1 s so the board has states to show). Celery's place is taken by a thread
of this test that runs the engine's dispatch and step tasks in order, as a worker would
(tests/campaigns/fleet.drive); real workers run campaigns in tests/campaigns/test_e2e.py.
Screenshots go to the test's tmp dir, `artifacts/` (and to $GPUSWEEP_TEST_ARTIFACTS when set).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from advisories.exposure import recompute
from advisories.models import Advisory
from campaigns.choices import CampaignStatus
from campaigns.models import Campaign
from gpusweep.pages import installed
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES
from tests.browser import page  # noqa: F401  (fixture)
from tests.campaigns.fleet import drive, make_fleet, user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _demo_fleet() -> None:
    call_command("ingest_advisories", str(FIXTURES), verbosity=0)
    make_fleet(nodes=4, spares=2)
    Cluster.objects.filter(name="local").update(connection={"executor": "memory", "step_seconds": 0.1})
    recompute()


UNLABELLED = """() => [...document.querySelectorAll('input, select, textarea')]
  .filter(el => el.type !== 'hidden' && !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                && !el.getAttribute('aria-labelledby'))
  .map(el => el.name || el.id || el.outerHTML.slice(0, 80))"""


def _accessible(tab: Any) -> None:
    """What a screen reader and a keyboard need on every page: labelled fields, landmarks, a skip link;
    and on a phone, no page wider than the screen."""
    assert tab.evaluate(UNLABELLED) == [], tab.url
    assert tab.locator("main#main").count() == 1 and tab.locator("nav[aria-label=Main]").count() == 1
    assert tab.locator("h1").count() == 1
    tab.keyboard.press("Tab")
    assert tab.evaluate("document.activeElement.className") == "skip"  # the first stop skips to the content
    tab.keyboard.press("Enter")
    assert tab.evaluate("document.activeElement.id") == "main"
    size = tab.viewport_size
    tab.set_viewport_size({"width": 390, "height": 844})  # a phone: wide tables scroll in their own box
    assert tab.evaluate("document.documentElement.scrollWidth") <= 391, tab.url
    tab.set_viewport_size(size)


def _driver(stop: threading.Event) -> None:
    """What a Celery worker does: run dispatch and each node's steps until the campaign rests."""
    try:
        while not stop.is_set():
            for campaign in Campaign.objects.filter(status__in=CampaignStatus.ACTIVE):
                drive(campaign.pk, rounds=1)
            time.sleep(0.3)
    finally:
        connections.close_all()


def test_a_new_user_plans_approves_and_watches_a_campaign_finish(page: Any, live_server: Any,  # noqa: F811
                                                                 tmp_path: Path):
    _demo_fleet()
    user("otto", "operator")
    user("anna", "approver")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.set_viewport_size({"width": 1280, "height": 900})

    def shot(name: str) -> None:
        page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)

    def login(name: str) -> None:
        page.context.clear_cookies()
        page.goto(f"{live_server.url}/accounts/login/")
        page.fill("input[name=username]", name)
        page.fill("input[name=password]", f"pw-{name}-123456")
        page.click("main button[type=submit]")
        page.wait_for_selector("h1:has-text('Overview')")

    login("otto")
    page.wait_for_selector("[data-chart='chart-burn-down'][data-rendered='true'] canvas")
    _accessible(page)
    shot("1-overview")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Advisories").click()
    page.get_by_role("link", name="NVIDIA 5703").click()
    assert "R570 (Linux, Tesla): below 570.195.03, fixed in 570.195.03" in page.inner_text("#ranges")
    assert "Expected (published)" in page.inner_text("#integrity-detail")
    _accessible(page)
    shot("2-advisory")
    page.click("#plan-campaign")

    # The wizard: the advisory is chosen; pick the cluster and watch the count follow.
    advisory = Advisory.objects.get(publisher_id="5703")
    assert page.is_checked(f"#adv-{advisory.public_id}")
    _accessible(page)
    page.wait_for_selector("#match-count[data-nodes='6']")
    page.fill("#id_node_names", "gpu00,gpu01,gpu02,gpu03")
    page.wait_for_selector("#match-count[data-nodes='4']")
    page.check("input[name=clusters][value=local]")
    page.fill("#id_parallelism_per_cluster", "2")
    page.fill("#id_canary", "0")
    page.fill("#id_soak_s", "0")
    page.click("#preview-button")
    page.wait_for_selector("#preview #plan-timeline")
    assert "Integrity mismatch: NVIDIA 5703" in page.inner_text("#preview")
    assert "Wave 2" in page.inner_text("#preview")
    shot("3-wizard-preview")
    page.click("#create-and-plan")
    page.wait_for_selector("#plan-timeline")
    campaign_url = page.url
    assert page.inner_text("#campaign-status") == "Planned"
    assert page.locator("#actions button", has_text="Approve").count() == 0  # the requester cannot approve

    login("anna")
    page.goto(campaign_url)
    page.fill("#approve-comment", "matches the bulletin")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_selector("#campaign-status:has-text('Approved')")
    _accessible(page)

    login("otto")
    page.goto(campaign_url)
    assert page.locator("#actions button", has_text="Pause").count() == 0  # not valid before it runs
    page.get_by_role("button", name="Start").click()
    page.wait_for_selector("#campaign-status:has-text('Running')")
    page.evaluate("window.__sameDocument = true")
    stop = threading.Event()
    worker = threading.Thread(target=_driver, args=(stop,), daemon=True)
    worker.start()
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            progress = page.inner_text("#progress-text")
            if progress not in seen and "in progress" in progress and not any("in progress" in s for s in seen):
                shot("4-board-running")
            seen.add(progress)
            if page.inner_text("#campaign-status") == "Completed":
                break
            page.wait_for_timeout(300)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert page.inner_text("#campaign-status") == "Completed", page.inner_text("main")[-2000:]
    assert page.evaluate("window.__sameDocument") is True  # the board changed without a reload
    assert any("of 4 nodes done" in s and not s.startswith("4 of 4") for s in seen), seen
    assert "4 of 4 nodes done (100%)" in page.inner_text("#progress-text")
    assert page.locator("#actions").count() == 0  # nothing left to do on a completed campaign
    events = page.inner_text("#events")
    assert "Patching done, next: Rebooting" in events and "step_done" not in events
    shot("5-board-completed")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    shot("6-board-phone")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1  # no sideways scroll of the page
    assert failed == []  # nothing fetched from anywhere but the server, and nothing missing

    _copy_out(artifacts)
    # The PDF report is helper 16b's (reports app); this step passes once both branches are merged.
    campaign = Campaign.objects.get(pk=int(campaign_url.rstrip("/").rsplit("/", 1)[1]))
    if not installed(f"/campaigns/{campaign.pk}/report.pdf"):
        pytest.fail("/campaigns/<pk>/report.pdf is not installed: merge the reports app (issue 16, helper 16b)")
    page.set_viewport_size({"width": 1280, "height": 900})
    with page.expect_download() as download:
        page.click("#report-pdf")
    pdf = artifacts / "campaign-report.pdf"
    download.value.save_as(str(pdf))
    assert pdf.read_bytes().startswith(b"%PDF")
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    assert all(f"gpu0{i}" in text for i in range(4)) and "anna" in text
    assert "evidence verification" in text.lower() and "intact" in text.lower()  # the verification result
    subprocess.run(["pdftoppm", "-png", "-r", "60", "-f", "1", "-l", "1", str(pdf), str(artifacts / "report")],
                   check=True)
    _copy_out(artifacts)


def _copy_out(artifacts: Path) -> None:
    target = os.environ.get("GPUSWEEP_TEST_ARTIFACTS")
    if target:
        shutil.copytree(artifacts, Path(target) / "console-walk", dirs_exist_ok=True)
