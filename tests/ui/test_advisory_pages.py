"""Advisory, exposure and node pages as the security team reads them: summary first, ranges in words,
search, sort, grouping, bulk actions by role, the CSV of the filtered view, readable history."""

from __future__ import annotations

import csv
import io
import re

import pytest
from django.test import Client

from advisories.models import Advisory, AdvisoryEvent, Exposure
from inventory.models import ChangeLog, Cluster
from tests.ui.test_pages import fleet, viewer  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


def _login(client: Client, make_user, name: str, *roles: str) -> Client:  # type: ignore[no-untyped-def]
    make_user(name, *roles)
    client.login(username=name, password=f"pw-{name}-12345")
    return client


def test_the_advisory_list_searches_filters_and_sorts(viewer: Client, fleet: Cluster):  # noqa: F811
    assert "NVIDIA 5703" in viewer.get("/advisories/?q=5703").content.decode()
    assert "NVIDIA 5703" not in viewer.get("/advisories/?q=no-such-bulletin").content.decode()
    cve = Advisory.objects.get(publisher_id="5703").cves.first()
    assert "NVIDIA 5703" in viewer.get(f"/advisories/?q={cve.cve_id}").content.decode()
    affecting = viewer.get("/advisories/?affects=1&sort=exposed").content.decode()
    listed = re.findall(r">NVIDIA (\w+)</a>", affecting)
    assert listed and listed[0] == "5703"
    exposed = set(Exposure.objects.filter(state__in=["open", "presumed"]).values_list("advisory__publisher_id",
                                                                                      flat=True))
    assert set(listed) == exposed
    unaffected = re.findall(r">NVIDIA (\w+)</a>", viewer.get("/advisories/?affects=0").content.decode())
    assert not set(unaffected) & exposed and unaffected
    by_component = viewer.get("/advisories/?component=container_toolkit").content.decode()
    assert "NVIDIA 5703" not in by_component
    high = re.findall(r">NVIDIA (\w+)</a>", viewer.get("/advisories/?severity=high").content.decode())
    assert set(high) == set(Advisory.objects.filter(severity="high").values_list("publisher_id", flat=True))


def test_the_advisory_page_puts_the_summary_first_and_ranges_in_words(client: Client, make_user,  # type: ignore[no-untyped-def]
                                                                      fleet: Cluster):  # noqa: F811
    advisory = Advisory.objects.get(publisher_id="5703")
    operator = _login(client, make_user, "otto", "operator")
    page = operator.get(f"/advisories/{advisory.public_id}/").content.decode()
    assert page.index('id="summary"') < page.index('id="exposures"') < page.index('id="ranges"')
    assert "R570 (Linux, Tesla): below 570.195.03, fixed in 570.195.03" in page
    assert "all_versions_prior" not in page and "{'" not in page and "prior_to_570_195_03" not in page
    assert re.search(r'id="exposed-count">Exposed nodes<span class="big">2</span>prod: 2', page)
    # 5703's published hash does not match: both hashes shown.
    assert advisory.published_sha256 in page and advisory.content_sha256 in page
    assert f"/campaigns/new/?advisories={advisory.public_id}" in page
    assert 'href="https://www.cve.org/CVERecord?id=CVE-' in page
    client.logout()
    reader = _login(client, make_user, "vera", "viewer")
    assert "Plan a campaign" not in reader.get(f"/advisories/{advisory.public_id}/").content.decode()


def test_the_exposure_list_searches_groups_and_exports_the_filtered_view(viewer: Client, fleet: Cluster):  # noqa: F811
    page = viewer.get("/advisories/exposures/?q=gpu-old&group=advisory").content.decode()
    assert "prod/gpu-old" in page and "prod/gpu-r535" not in page
    assert 'scope="rowgroup">NVIDIA 5703:' in page
    assert "570.195.03" in page and "CVE-" in page  # fixed version and CVEs
    overdue = Exposure.objects.filter(node__name="gpu-old").first()
    assert overdue and overdue.deadline
    rows = list(csv.DictReader(io.StringIO(
        viewer.get("/advisories/exposures/?q=gpu-old&format=csv").content.decode())))
    assert {r["node"] for r in rows} == {"gpu-old"}
    assert all(r["fixed_version"] and r["cves"].startswith("CVE-") for r in rows)
    assert all(int(r["days_overdue"]) >= 0 for r in rows if r["days_overdue"])
    by_cluster = viewer.get("/advisories/exposures/?group=cluster&sort=node").content.decode()
    assert 'scope="rowgroup">prod' in by_cluster


def test_bulk_accept_risk_is_for_approvers_and_records_each_decision(client: Client, make_user,  # type: ignore[no-untyped-def]
                                                                      fleet: Cluster):  # noqa: F811
    ids = list(Exposure.objects.filter(node__name="gpu-old").values_list("pk", flat=True))
    operator = _login(client, make_user, "otto", "operator")
    body = {"action": "accept_risk", "exposure": ids, "reason": "air-gapped lab, no tenant code", "days": "30"}
    assert operator.post("/advisories/exposures/bulk/", body).status_code == 403
    planned = operator.post("/advisories/exposures/bulk/", {"action": "plan", "exposure": ids})
    assert planned.status_code == 302 and planned["Location"].startswith("/campaigns/new/?advisories=")
    advisories = {e.advisory.public_id for e in Exposure.objects.filter(pk__in=ids).select_related("advisory")}
    assert all(f"advisories={a}" in planned["Location"] for a in advisories)  # public ids, never the pk
    assert "nodes=gpu-old" in planned["Location"] and "clusters=prod" in planned["Location"]
    client.logout()
    approver = _login(client, make_user, "anna", "approver")
    short = approver.post("/advisories/exposures/bulk/", {**body, "reason": "short"}, follow=True)
    assert "Nothing was accepted" in short.content.decode()
    assert not Exposure.objects.filter(pk__in=ids, state="risk_accepted").exists()
    approver.post("/advisories/exposures/bulk/", body)
    assert set(Exposure.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"risk_accepted"}
    events = AdvisoryEvent.objects.filter(kind="risk_accepted")
    assert events.count() == len(ids) and all(e.user and e.user.username == "anna" for e in events)


def test_the_node_page_shows_pool_and_history_as_readable_diffs(viewer: Client, fleet: Cluster):  # noqa: F811
    node = fleet.nodes.get(name="gpu-old")
    node.pool = "batch"
    node.save()
    ChangeLog.objects.create(source="agent", action="update", object_type="node", object_id=node.pk,
                             object_repr="prod/gpu-old", changes={
                                 "component:driver": ["570.86.15", "570.195.03"], "pool": ["batch", "batch"],
                                 "labels": [{"rack": "a1", "zone": "z"}, {"rack": "a2", "zone": "z"}]})
    ChangeLog.objects.create(source="agent", action="update", object_type="node", object_id=node.pk,
                             object_repr="prod/gpu-old", changes={"pool": ["batch", "batch"]})
    page = viewer.get(f"/nodes/{node.pk}/").content.decode()
    assert '<dd id="pool">batch</dd>' in page
    history = page[page.index('id="history"'):]
    assert "<td>driver</td><td>570.86.15</td><td>570.195.03</td>" in history
    assert "<td>labels: rack</td><td>a1</td><td>a2</td>" in history
    assert "zone" not in history and "<td>pool</td>" not in history  # no no-op rows
    assert "{'" not in history and "[&#x27;" not in history
