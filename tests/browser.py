"""A real browser for UI tests: Debian's Chromium driven by Playwright.

Playwright's own browser download cannot run here (no internet), so tests launch the system
Chromium (`apt-get install chromium`, done by scripts/install-system-deps.sh).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from django.db import connections

from conftest import need

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page(live_server: object) -> Iterator[object]:
    need(os.path.exists(CHROMIUM), "install Debian's chromium (apt-get install chromium) for browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need(False, "pip install playwright (make venv does) for browser tests")
        raise
    # Playwright runs an event loop in this thread; the test's ORM calls are still synchronous.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            context = browser.new_context()
            yield context.new_page()
        finally:
            # With Playwright's loop running, the test's ORM calls get a connection of their own
            # (Django keys it by context, not thread); close it here, or it outlives the test
            # and the test database cannot be dropped at the end of the run.
            connections.close_all()
            browser.close()
