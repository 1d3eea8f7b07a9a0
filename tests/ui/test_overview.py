"""The overview: exposed nodes by severity, deadlines, burn-down, compliance per cluster, campaigns."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.test import Client
from django.utils import timezone

from advisories import overview
from advisories.models import Exposure
from inventory.models import Cluster
from tests.ui.test_pages import fleet, viewer  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def test_the_overview_counts_exposed_overdue_and_compliance(viewer: Client, fleet: Cluster):  # noqa: F811
    exposed = Exposure.objects.filter(state="open")
    nodes = exposed.values("node").distinct().count()
    assert nodes == 2  # gpu-old and gpu-r535; gpu-fixed is compliant
    first = exposed.order_by("id").first()
    assert first is not None
    Exposure.objects.update(deadline=timezone.now() + dt.timedelta(days=30))
    Exposure.objects.filter(node_id=first.node_id).update(deadline=timezone.now() - dt.timedelta(days=3))
    page = viewer.get("/").content.decode()
    assert re.search(r'id="overdue".*?<span class="big">1</span>node overdue', page, re.S)
    compliance = {row["cluster"]: row for row in overview.compliance_by_cluster()}
    assert compliance["prod"] == {"cluster": "prod", "nodes": 3, "exposed": 2, "percent": 33.3}
    assert "33.3%" in page
    charts = json.loads(re.search(r'<script id="chart-burn-down" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    assert charts["series"][0]["values"][-1] == exposed.count()
    assert charts["series"][1]["values"][-1] == 2


def test_the_burn_down_falls_when_a_node_is_remediated(fleet: Cluster):  # noqa: F811
    now = timezone.now()
    Exposure.objects.update(first_seen=now - dt.timedelta(days=5))
    old = fleet.nodes.get(name="gpu-old")
    Exposure.objects.filter(node=old).update(state="remediated", remediated_at=now - dt.timedelta(days=2))
    data = overview.burn_down(now, days=10)
    assert data["nodes"][-1] == 1 and data["nodes"][-3] == 1 and data["nodes"][-4] == 2 and data["nodes"][0] == 0
    # Node-days: 2 nodes for 3 days, 1 node for 3 days (the remediation day counts as fixed).
    assert data["node_days"][-1] == 2 * 3 + 1 * 3


def test_admins_change_the_deadline_policy_and_every_deadline_follows(client: Client, make_user,  # type: ignore[no-untyped-def]
                                                                       fleet: Cluster):  # noqa: F811
    from advisories.models import AdvisoryEvent, DeadlinePolicy

    make_user("vera", "viewer")
    client.login(username="vera", password="pw-vera-12345")
    page = client.get("/settings/").content.decode()
    assert "prod" in page and 'id="policy-form"' not in page
    assert client.post("/settings/", {"critical_days": "5"}).status_code == 403
    client.logout()
    make_user("ada", "admin")
    client.login(username="ada", password="pw-ada-12345")
    exposure = Exposure.objects.filter(state="open", severity="high").first()
    assert exposure is not None
    before = exposure.deadline
    response = client.post("/settings/", {"critical_days": "15", "high_days": "60", "medium_days": "90",
                                          "low_days": "180", "basis": "publication", "use_kev": "on"})
    assert response.status_code == 302
    policy = DeadlinePolicy.current()
    assert policy.high_days == 60 and policy.recomputing, "the page answers before the deadlines move"
    # What the worker runs once the change commits (advisories.services.deadlines_changed).
    from advisories.tasks import refresh_deadlines
    refresh_deadlines(policy.generation)
    assert not DeadlinePolicy.current().recomputing
    exposure.refresh_from_db()
    assert before and exposure.deadline and (exposure.deadline - before).days == 30
    event = AdvisoryEvent.objects.get(kind="policy_changed")
    assert event.user.username == "ada" and event.details["changes"]["high_days"] == [30, 60]
