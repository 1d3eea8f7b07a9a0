"""The demo as a new user meets it: `serve --demo` (what `make run` starts) on the embedded default,
driven in a real browser (Debian's Chromium through Playwright): create, plan, approve as a second
person, start, and see every node patched and every counter continue after its move."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from campaigns.demo import printed_logins
from conftest import need
from tests.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.helpers import REPO, clean_env, free_port, get_json, manage, stop_process_group, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _counts(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def test_a_new_user_sweeps_the_demo_fleet_and_every_counter_continues(tmp_path: Path):
    need(os.path.exists(CHROMIUM), "install Debian's chromium (apt-get install chromium) for browser tests")
    from playwright.sync_api import Page, sync_playwright

    var = tmp_path / "var"
    env = clean_env(GPUSWEEP_VAR_DIR=str(var))
    assert manage("migrate", "--noinput", env=env).returncode == 0
    created = manage("ensure_demo_admin", env=env)
    logins = printed_logins(created.stdout)
    assert set(logins) == {"admin", "approver"}, created.stdout

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "serve.log").open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "serve", "--port", str(port), "--demo", "--concurrency", "2"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        def ready() -> bool:
            try:
                return get_json(f"{base}/readyz")[0] == 200
            except OSError:
                return False

        assert wait_for(ready, timeout=90), (tmp_path / "serve.log").read_text()[-3000:]
        # The swept pool "batch" holds gpu01-04 (R570) and gpu07-09 (R580); gpu06 is already fixed.
        counters = [var / "demo" / f"counter-gpu{i:02d}.log" for i in (1, 2, 3, 4, 7, 8, 9)]
        assert wait_for(lambda: all(len(_counts(c)) >= 3 for c in counters), timeout=60)

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            page = browser.new_page()

            def login(user: str) -> None:
                page.context.clear_cookies()
                page.goto(f"{base}/accounts/login/")
                page.fill("input[name=username]", user)
                page.fill("input[name=password]", logins[user])
                page.click("main button[type=submit]")
                page.wait_for_selector("h1:has-text('Overview')")

            login("admin")

            def counters_listed() -> bool:
                found = page.request.get(f"{base}/api/v1/inventory/workloads/?limit=100").json()["results"]
                return sum(1 for w in found if w["name"].startswith("counter on") and not w["gone_at"]) == 10

            # Each agent's first heartbeat may come before its counter registers with it; the next one
            # (10 s) lists it again. A person reading the README is slower than that: so is the test.
            assert wait_for(counters_listed, timeout=60, interval=1)
            # The demo fleet is exposed to bulletin 5703 once its agents have reported.
            page.goto(f"{base}/advisories/exposures/")
            assert "demo/gpu01" in page.inner_text("#exposure-table")
            page.goto(f"{base}/campaigns/new/")
            page.fill("input[name=name]", "Patch 5703")
            page.check("#advisory-choice tr:has-text('NVIDIA 5703') input[name=advisories]")
            page.check("input[name=pools][value=batch]")
            page.fill("input[name=parallelism_per_cluster]", "2")
            page.fill("input[name=soak_s]", "0")  # the demo needs no 10-minute soak after its canary
            page.click("#create-and-plan")  # the wizard creates the campaign and makes its plan
            page.wait_for_selector("#plan-timeline")
            campaign_url = page.url
            assert page.locator("#plan-warnings li", has_text="No capacity").count() == 0

            login("approver")
            page.goto(campaign_url)
            # Wait for the POST's answer: navigating away at once could cancel the form's submission.
            with page.expect_navigation():
                page.click("button:has-text('Approve')")
            assert "Approved" in page.inner_text("#campaign-status")

            login("admin")
            page.goto(campaign_url)
            before = {c.name: max(_counts(c)) for c in counters}
            with page.expect_navigation():
                page.click("button:has-text('Start')")

            def finished(p: Page = page) -> str | None:
                p.goto(campaign_url)
                status = p.inner_text("#campaign-status")
                return status if any(s in status for s in ("Completed", "Halted", "Aborted")) else None

            status = wait_for(finished, timeout=300, interval=3)
            assert status and "Completed" in status, page.inner_text("main")[-3000:]
            sweeps = page.inner_text("#sweeps")
            assert sweeps.count("Done") == 7 and "Failed" not in sweeps
            evidence = page.request.get(f"{campaign_url}evidence.json").json()
            assert evidence["verified"] is True
            # As the README says: every counter moved to gpu06, and the report shows each counter's own step
            # when it was checkpointed and where it resumed (issue 31).
            report = page.request.get(f"{campaign_url}report.json").json()
            assert len(report["moves"]) == 7 and {m["target_node"] for m in report["moves"]} == {"gpu06"}
            assert all(isinstance(m["steps_before"], int) and m["steps_after"] == m["steps_before"] > 0
                       for m in report["moves"]), report["moves"]
            browser.close()

        # Every counter went on from where it was: no reset, no gap, and it is still counting.
        time.sleep(3)
        for counter in counters:
            values = _counts(counter)
            assert values == list(range(values[0], values[0] + len(values))), f"{counter.name} has a gap or reset"
            assert values[-1] > before[counter.name]
    finally:
        stop_process_group(proc, timeout=30)
