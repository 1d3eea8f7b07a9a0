"""The small things a new user trips on: CVSS with one decimal, "Last seen" in UTC, a favicon, a
way back from the API docs, and a refusal that says which role an action takes."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client

from advisories.models import CVE, Advisory
from campaigns import services
from inventory.models import Cluster, Node
from tests.campaigns.fleet import make_fleet, user

pytestmark = pytest.mark.django_db


def _as(*roles: str) -> Client:
    client = Client()
    client.force_login(user("-".join(roles) + "-user", *roles))
    return client


def test_cvss_has_one_decimal_and_last_seen_says_utc():
    advisory = Advisory.objects.create(publisher="NVIDIA", publisher_id="7001", title="t", source_kind="file")
    advisory.cves.add(CVE.objects.create(cve_id="CVE-2026-0001", base_score="8.2"))
    cluster = Cluster.objects.create(name="c", kind="static")
    Node.objects.create(cluster=cluster, name="n1", last_seen=dt.datetime(2026, 3, 4, 22, 5, tzinfo=dt.UTC))
    viewer = _as("viewer")
    listed = viewer.get("/advisories/").content.decode()
    assert re.search(r'<td class="num">8\.2</td>', listed) and "8.20" not in listed
    assert "CVSS 8.2 (highest)" in viewer.get(f"/advisories/{advisory.public_id}/").content.decode()
    assert "2026-03-04 22:05 UTC" in viewer.get("/nodes/").content.decode()


def test_a_favicon_and_a_way_back_from_the_api_docs():
    icon = Client().get("/favicon.ico")
    assert icon.status_code == 301 and icon["Location"].endswith("/console/favicon.svg")
    viewer = _as("viewer")
    assert 'rel="icon"' in viewer.get("/").content.decode()
    docs = viewer.get("/api/docs/").content.decode()
    assert 'id="back-to-console" href="/"' in docs and "swagger-ui" in docs


def test_an_approver_who_tries_to_start_is_told_which_role_starts():
    make_fleet(nodes=1, spares=0)
    operator, approver = user("olga", "operator"), user("abe", "approver")
    campaign = services.create_campaign(operator, {"name": "m", "node_selector": {"sweep": "yes"}, "canary": "0",
                                                   "target_versions": {"driver": {"R570": "570.195.03"}}})
    services.make_plan(campaign.pk, operator)
    services.approve(campaign.pk, approver)
    client = Client()
    client.force_login(approver)
    page = client.post(f"/campaigns/{campaign.pk}/start/")
    assert page.status_code == 403
    assert "Start needs the operator role; your roles: approver" in page.content.decode()
    api = client.post(f"/api/v1/campaigns/campaigns/{campaign.pk}/start/")
    assert api.status_code == 403 and api.json()["detail"] == "start needs the operator role; yours: approver"


def test_versions_read_in_one_order_before_and_after():
    """The board's before and after columns list the driver first, then the rest by name, whatever order
    the back end reported them in or the database kept them in."""
    from console.templatetags.console import versions

    assert versions({"driver": "570.172.08", "cuda": "12.8"}) == "driver 570.172.08, cuda 12.8"
    assert versions({"cuda": "12.8", "kernel": "6.8.0", "driver": "570.195.03"}) == (
        "driver 570.195.03, cuda 12.8, kernel 6.8.0")
