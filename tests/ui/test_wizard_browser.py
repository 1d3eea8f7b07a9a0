"""The campaign wizard in a real browser on a phone's screen (issue 31): the search box filters the
advisories, a match among those with no exposed node opens their list, and the plan preview is
scrolled into view where the buttons are."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from advisories import counts
from advisories.models import Advisory
from tests.browser import page  # noqa: F401  (fixture)
from tests.campaigns.fleet import user
from tests.ui.test_walk_browser import _demo_fleet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VISIBLE = "[...document.querySelectorAll('#advisory-choice tr[data-search]')].filter(r => !r.hidden)" \
          ".map(r => r.querySelector('input').value)"


def test_the_wizard_search_toggle_and_preview_on_a_phone(page: Any, live_server: Any):  # noqa: F811
    _demo_fleet()
    client = Client()
    client.force_login(user("otto", "operator"))
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value,
                               "url": live_server.url}])
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/campaigns/new/")
    found = counts.per_advisory()
    quiet = next(a for a in Advisory.objects.prefetch_related("cves").order_by("pk")
                 if a.pk not in found and a.cves.exists())
    assert page.evaluate("document.getElementById('advisories-others').open") is False

    page.fill("#advisory-search", "5703")
    assert page.evaluate(VISIBLE) == ["nvidia-5703"]
    assert "1 of" in page.inner_text("#advisory-search-status")
    page.fill("#advisory-search", quiet.cves.first().cve_id.lower())  # a CVE of an advisory exposing nothing
    assert quiet.public_id in page.evaluate(VISIBLE)
    assert page.evaluate("document.getElementById('advisories-others').open") is True
    page.press("#advisory-search", "Enter")  # filters, does not submit the wizard
    assert page.url.endswith("/campaigns/new/")
    page.fill("#advisory-search", "")
    assert page.evaluate("document.getElementById('advisories-others').open") is False
    assert len(page.evaluate(VISIBLE)) == Advisory.objects.count()

    page.check("#adv-nvidia-5703")
    page.fill("#id_name", "Patch 5703")
    page.check("input[name=clusters][value=local]")
    page.fill("#id_canary", "0")
    page.fill("#id_soak_s", "0")
    page.click("#preview-button")
    page.wait_for_selector("#preview #preview-body")
    assert page.locator("#preview #plan-timeline").count() == 1, page.inner_text("#preview")
    page.wait_for_timeout(300)  # htmx's show:top scroll
    top = page.evaluate("document.getElementById('preview').getBoundingClientRect().top")
    assert 0 <= top < 844 / 2, f"the preview starts at {top} px: out of sight"
    assert page.evaluate("document.documentElement.scrollWidth") <= 391
