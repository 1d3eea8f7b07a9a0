"""Every console page at a phone's 390 px and a desktop's 1280 px, as each role, in a real browser:
no page scrolls sideways (wide tables scroll in their own box), none logs a console error, and
none costs the server more than a second of CPU or MAX_QUERIES SQL statements.

The server's cost is measured in the live server's thread (``ServerCost``), not as the browser's wait
for the first byte: on the shared 2-core CI machine that wait is mostly the time the thread waits for a
core (a page of 0.03 s of CPU was seen taking 1.12 s), while CPU time and the statement count grow only
with the page's own work (a slow loop, a query per row).

The pages are found by walking the URL conf: a new console URL needs an example (EXAMPLES) or a
reason it is no page (NOT_PAGES), or this test fails.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.signals import request_finished, request_started
from django.db import connections
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from advisories.models import Advisory
from campaigns.models import Campaign
from inventory.models import Node
from tests.browser import page  # noqa: F401  (fixture)
from tests.campaigns.fleet import approved_campaign, user
from tests.ui.test_walk_browser import _demo_fleet
from webhooks import queue, services
from webhooks.models import Subscription

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ROLES = ("viewer", "operator", "approver", "admin")
WIDTHS = (390, 1280)
SERVER_S = float(os.environ.get("GPUSWEEP_TEST_PAGE_S", "1.0"))  # CPU seconds of the server's thread
# SQL statements of one page: the most at this data is 25 (the overview, by role); a statement per node,
# campaign or advisory would pass it.
MAX_QUERIES = 40
# Not pages of their own: probes, Django's account forms, files, htmx fragments, POST-only actions, and the
# single sign-on's redirects to and from the identity provider (404 where none is configured).
NOT_PAGES = {
    "healthz", "readyz", "metrics", "login", "logout", "oidc-authenticate", "oidc-callback",
    "password_change", "password_change_done", "password_reset",
    "password_reset_done", "password_reset_confirm", "password_reset_complete",
    "campaign-report", "advisory-report", "pending-report", "campaigns-ui:campaign-evidence",
    "campaigns-ui:campaign-board", "campaigns-ui:campaign-match", "campaigns-ui:campaign-preview",
    "advisories-ui:exposure-bulk", "advisories-ui:exposure-decide", "advisories-ui:review-resolve",
    "campaigns-ui:campaign-action", "accounts-ui:token-revoke", "webhooks-ui:subscription-delete",
    "webhooks-ui:subscription-test", "webhooks-ui:delivery-replay",
}


def _names(patterns: list[Any], namespace: str = "", prefix: str = "") -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if str(pattern.pattern).startswith(("api/", "admin/", "^api", "^admin")):
                continue
            inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
            found += _names(pattern.url_patterns, inner, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern) and not (prefix + str(pattern.pattern)).startswith(("api/", "admin/")):
            found.append((namespace + (pattern.name or ""), prefix + str(pattern.pattern)))
    return found


def _examples() -> dict[str, dict[str, Any]]:
    campaign = Campaign.objects.order_by("pk").first()
    subscription = Subscription.objects.order_by("pk").first()
    assert campaign is not None and subscription is not None
    return {"advisories-ui:advisory-detail": {"public_id": Advisory.objects.get(publisher_id="5703").public_id},
            "inventory-ui:node-detail": {"pk": Node.objects.order_by("pk").first().pk},  # type: ignore[union-attr]
            "campaigns-ui:campaign-detail": {"pk": campaign.pk},
            "webhooks-ui:subscription-edit": {"pk": subscription.pk}}


def _console_urls() -> list[str]:
    examples = _examples()
    urls, missing = [], []
    for name, route in _names(get_resolver().url_patterns):
        if name in NOT_PAGES:
            continue
        if "<" in route and name not in examples:
            missing.append(f"{name} ({route})")
            continue
        urls.append(reverse(name, kwargs=examples.get(name)))
    assert not missing, f"console URLs with no example in EXAMPLES nor a reason in NOT_PAGES: {missing}"
    return sorted(set(urls))


def _data() -> None:
    _demo_fleet()
    people = {role: user(f"{role}-walker", role) for role in ROLES}
    campaign = approved_campaign(people["operator"], people["approver"], name="walk sweep")
    campaign.advisories.set(Advisory.objects.filter(publisher_id="5703"))
    subscription = Subscription.objects.create(name="soc", url="https://soc.example/hook", secret="s" * 20)
    queue.ENQUEUE.insert(0, lambda *args, **kwargs: None)
    try:
        services.send_test(subscription, people["admin"])
    finally:
        queue.ENQUEUE.pop(0)


class ServerCost:
    """The CPU seconds and SQL statements the server's thread spent on each request, by path (the last
    request of each), from request_started to request_finished (the response closed)."""

    def __init__(self) -> None:
        self.by_path: dict[str, tuple[float, int]] = {}
        self._local = threading.local()

    def _count(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if getattr(self._local, "path", None) is not None:
            self._local.queries += 1
        return execute(sql, params, many, context)

    def _started(self, sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        self._local.path, self._local.cpu, self._local.queries = environ.get("PATH_INFO", ""), time.thread_time(), 0
        for connection in connections.all():
            if self._count not in connection.execute_wrappers:
                connection.execute_wrappers.append(self._count)

    def _finished(self, sender: Any, **kwargs: Any) -> None:
        path = getattr(self._local, "path", None)
        if path is not None:
            self.by_path[path] = (time.thread_time() - self._local.cpu, self._local.queries)
            self._local.path = None

    def of(self, path: str, timeout: float = 5.0) -> tuple[float, int] | None:
        """The cost of the last request of `path`: the browser may fire "load" before the server's thread
        has closed the response."""
        deadline = time.monotonic() + timeout
        while path not in self.by_path and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.by_path.get(path)


@contextmanager
def server_cost() -> Iterator[ServerCost]:
    cost = ServerCost()
    request_started.connect(cost._started)
    request_finished.connect(cost._finished)
    try:
        yield cost
    finally:
        request_started.disconnect(cost._started)
        request_finished.disconnect(cost._finished)
        for connection in connections.all():
            if cost._count in connection.execute_wrappers:
                connection.execute_wrappers.remove(cost._count)


def _visit(tab: Any, url: str, logged: list[str], cost: ServerCost) -> list[str]:
    """What is wrong with the page at `url` at both widths (loaded once per width); `logged` gets
    the tab's console errors."""
    problems: list[str] = []
    path = urlsplit(url).path
    for width in WIDTHS:
        logged.clear()
        tab.set_viewport_size({"width": width, "height": 844 if width < 600 else 900})
        cost.by_path.pop(path, None)
        response = tab.goto(url, wait_until="load")
        status = response.status if response else 0
        # A role refused a page sees the 403 page; the browser logs the status itself as an error.
        errors = [e for e in logged if not (status == 403 and "status of 403" in e)]
        # The browser's wait for the first byte, for the message only: under load it is mostly the wait for a core.
        waited = tab.evaluate("(() => { const n = performance.getEntriesByType('navigation')[0];"
                              " return (n.responseStart - n.requestStart) / 1000; })()")
        # A permanent redirect (favicon.ico) the browser remembers from the first width asks the server nothing.
        redirected = response is not None and urlsplit(response.url).path != path
        spent = cost.of(path, timeout=0.5 if redirected else 5.0)
        wide = tab.evaluate("document.documentElement.scrollWidth")
        if status not in (200, 403):
            problems.append(f"{url} @{width}: HTTP {status}")
        if wide > width + 1:
            culprit = tab.evaluate(WIDEST, width)
            problems.append(f"{url} @{width}: {wide} px wide ({culprit})")
        # A chart sizes to its box (ResizeObserver in charts.js): it never scrolls inside it either.
        charts = tab.evaluate("[...document.querySelectorAll('[data-chart]')].filter(b => "
                              "b.scrollWidth > b.clientWidth + 1).map(b => b.dataset.chart)")
        if charts:
            problems.append(f"{url} @{width}: charts wider than their box {charts}")
        if errors:
            problems.append(f"{url} @{width}: console errors {errors}")
        if spent is None and not redirected:
            problems.append(f"{url} @{width}: the server recorded no request of {path}")
        elif spent is not None and (spent[0] > SERVER_S or spent[1] > MAX_QUERIES):
            problems.append(f"{url} @{width}: {spent[0]:.2f} s of the server's CPU and {spent[1]} SQL statements "
                            f"(bounds {SERVER_S} s, {MAX_QUERIES}; the browser waited {waited:.2f} s)")
    return problems


# The element reaching furthest right outside any box that scrolls or clips, to say what overflows.
WIDEST = """(width) => { let worst = null, right = width;
  const clipped = el => { for (let p = el.parentElement; p; p = p.parentElement) {
    if (getComputedStyle(p).overflowX !== 'visible') return true; } return false; };
  for (const el of document.querySelectorAll('body *')) { const r = el.getBoundingClientRect().right;
    if (r > right && !clipped(el)) { right = r; worst = el; } }
  return worst ? `${worst.tagName.toLowerCase()}#${worst.id}.${worst.className} to ${Math.round(right)} px` : ''; }"""


def test_every_console_page_fits_a_phone_and_a_desktop_for_every_role(page: Any, live_server: Any):  # noqa: F811
    _data()
    urls = _console_urls()
    assert len(urls) >= 14, urls
    problems: list[str] = []
    logged: list[str] = []
    page.on("console", lambda message: logged.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: logged.append(str(error)))
    with server_cost() as cost:
        for role in ROLES:
            client = Client()
            client.force_login(user_for(role))
            page.context.clear_cookies()
            page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                                       "url": live_server.url}])
            for url in urls:
                problems += [f"[{role}] {p}" for p in _visit(page, live_server.url + url, logged, cost)]
    assert not problems, "\n".join(problems)


def user_for(role: str) -> Any:
    from django.contrib.auth.models import User

    return User.objects.get(username=f"{role}-walker")
