"""The auditors' reports: a campaign's PDF (turned into images by pdftoppm and read back by
pdftotext) names its nodes, approvals and the evidence verification; CSV and JSON say the same;
the advisory and pending-patches reports list every node; viewers read, nobody without a role."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from django.test import Client

from accounts import services as tokens
from campaigns.models import Campaign
from conftest import need

pytestmark = pytest.mark.django_db


def _viewer(make_user) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(make_user("vera", "viewer"))
    return client


def test_the_campaign_pdf_shows_nodes_approvals_and_the_verification(seeded, make_user, tmp_path: Path):
    need(bool(shutil.which("pdftoppm") and shutil.which("pdftotext")),
         "needs poppler-utils: scripts/install-system-deps.sh")
    campaign = Campaign.objects.get(pk=seeded.campaigns["completed"])
    response = _viewer(make_user).get(f"/campaigns/{campaign.pk}/report.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(response.content)
    subprocess.run(["pdftoppm", "-png", "-r", "50", str(pdf), str(tmp_path / "page")], check=True, timeout=60)
    pages = sorted(tmp_path.glob("page*.png"))
    assert pages and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000 for p in pages)
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True, text=True,
                          timeout=60).stdout
    for sweep in campaign.sweeps.select_related("node"):
        assert sweep.node.name in text
    for approval in campaign.approvals.select_related("user"):
        assert approval.user.username in text
    assert "Evidence verification" in text and "INTACT" in text
    assert campaign.seals.order_by("-number").first().body["root"][:20] in text.replace("\n", "")
    assert "How to verify".lower() in text.lower() and "python -m campaigns.verify" in text


def test_the_campaign_csv_and_json_carry_the_same_nodes(seeded, make_user):
    client = _viewer(make_user)
    pk = seeded.campaigns["completed"]
    data = json.loads(client.get(f"/campaigns/{pk}/report.json").content)
    assert data["verification"]["intact"] is True and data["verification"]["seal"]["signature"]
    assert data["approvals"] and data["nodes"] and all(n["versions_after"] for n in data["nodes"])
    assert data["report"]["covers"] and "campaigns.verify" in data["report"]["how_to_verify"]
    rows = list(csv.reader(io.StringIO(client.get(f"/campaigns/{pk}/report.csv").content.decode())))
    start = rows.index(["# Nodes"])
    header = rows[start + 1]
    listed = {row[header.index("node")] for row in rows[start + 2:start + 2 + len(data["nodes"])]}
    assert listed == {n["node"] for n in data["nodes"]}


def test_evidence_pdf_is_the_report_not_json(seeded, make_user):
    client = _viewer(make_user)
    pk = seeded.campaigns["completed"]
    response = client.get(f"/campaigns/{pk}/evidence.pdf")
    assert response.status_code == 302 and response["Location"].endswith(f"/campaigns/{pk}/report.pdf")
    assert client.get(f"/campaigns/{pk}/evidence.xml").status_code == 404
    assert client.get(f"/campaigns/{pk}/report.xml").status_code == 404


def test_the_advisory_report_lists_every_exposed_node_with_its_outcome(seeded, make_user):
    from advisories.models import Exposure

    exposure = Exposure.objects.select_related("advisory", "node").order_by("pk").first()
    advisory = exposure.advisory
    data = json.loads(_viewer(make_user).get(f"/advisories/{advisory.public_id}/report.json").content)
    assert len(data["exposures"]) == Exposure.objects.filter(advisory=advisory).count()
    assert exposure.node.name in {row["node"] for row in data["exposures"]}
    assert sum(data["counts"].values()) == len(data["exposures"])
    assert _viewer_pdf_ok(make_user, f"/advisories/{advisory.public_id}/report.pdf")


def _viewer_pdf_ok(make_user, url: str) -> bool:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(make_user("vic2", "viewer"))
    response = client.get(url)
    return response.status_code == 200 and response.content[:5] == b"%PDF-"


def test_pending_patches_names_a_date_for_each_scheduled_exposure(seeded, make_user):
    from advisories.choices import ExposureState
    from advisories.models import Exposure
    from campaigns import services
    from tests.campaigns.fleet import FIXED

    operator = Campaign.objects.get(pk=seeded.campaigns["planned"]).requested_by
    spares = Campaign.objects.create(name="spares", requested_by=operator, node_selector={"names": ["spare00"]},
                                     target_versions={"driver": {"R570": FIXED}})
    services.make_plan(spares.pk, operator)
    viewer = _viewer(make_user)
    data = json.loads(viewer.get("/advisories/pending.json").content)
    pending = Exposure.objects.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED]).count()
    assert len(data["exposures"]) == pending == data["summary"]["exposures"]
    scheduled = [r for r in data["exposures"] if r["campaign"]]
    assert scheduled and {r["node"] for r in scheduled} == {"spare00"}
    assert all(r["scheduled_for"] and r["campaign_name"] == "spares" for r in scheduled)
    assert {r["node"] for r in data["exposures"] if not r["campaign"]} >= {"spare01"}
    assert data["summary"]["unscheduled"] == len(data["exposures"]) - len(scheduled)
    text = viewer.get("/advisories/pending.csv").content.decode()
    assert "# Pending patches" in text and "scheduled_for" in text


def test_reports_through_the_api_and_with_a_token(seeded, make_user):
    _token, key = tokens.issue(make_user("vera", "viewer"), "auditor")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    pk = seeded.campaigns["completed"]
    api = Client().get(f"/api/v1/reports/campaigns/{pk}/report.pdf", HTTP_ACCEPT="application/json", **auth)
    assert api.status_code == 200 and api.content[:5] == b"%PDF-"
    assert Client().get(f"/api/v1/reports/campaigns/{pk}/report.json", **auth).json()["nodes"]
    assert Client().get("/api/v1/reports/pending.csv", {"cluster": "local"}, **auth).status_code == 200
    assert Client().get("/api/v1/reports/pending.csv", {"clustr": "local"}, **auth).status_code == 400
    assert Client().get("/api/v1/reports/campaigns/999999/report.json", **auth).status_code == 404
    # The UI URL with the token (a script's download), no session.
    assert Client().get(f"/campaigns/{pk}/report.csv", **auth).status_code == 200


def test_a_user_with_no_role_reads_no_report(seeded, make_user):
    client = Client()
    client.force_login(make_user("nora"))
    assert client.get(f"/campaigns/{seeded.campaigns['completed']}/report.json").status_code == 403
    assert client.get("/api/v1/reports/pending.json").status_code == 403


def _section(text: str, title: str) -> list[dict[str, str]]:
    rows = list(csv.reader(io.StringIO(text)))
    start = rows.index([f"# {title}"])
    header, found = rows[start + 1], []
    for row in rows[start + 2:]:
        if not row or row[0].startswith("#"):
            break
        found.append(dict(zip(header, row, strict=False)))
    return found


def test_moved_workloads_show_their_progress_before_and_after_or_not_reported(seeded, make_user):
    """Issue 31: the "Steps before/after" column is the workload's own progress marker (the counter's
    step), from its move or else from the evidence's restored event; "not reported" where it gave none."""
    from campaigns.choices import MoveState
    from campaigns.models import WorkloadMove
    from inventory.choices import WorkloadPolicy

    pk = seeded.campaigns["completed"]
    moved = list(WorkloadMove.objects.filter(sweep__campaign_id=pk, state=MoveState.RESTORED).order_by("pk"))
    assert moved and all(m.steps_after >= m.steps_before > 0 for m in moved)
    first = moved[0]
    # A back end whose row kept no progress: the restored event in the evidence still carries it.
    WorkloadMove.objects.filter(pk=first.pk).update(steps_before=None, steps_after=None)
    WorkloadMove.objects.create(sweep=first.sweep, workload_ref="quiet-1", workload_name="quiet", gpus=1,
                                policy=WorkloadPolicy.WAIT, state=MoveState.FINISHED)
    client = _viewer(make_user)
    data = json.loads(client.get(f"/campaigns/{pk}/report.json").content)
    by_name = {m["workload"]: m for m in data["moves"]}
    assert (by_name[first.workload_name]["steps_before"], by_name[first.workload_name]["steps_after"]) == \
        (first.steps_before, first.steps_after)
    assert all(by_name[m.workload_name]["steps_after"] == m.steps_after for m in moved)
    assert by_name["quiet"]["steps_before"] is None and by_name["quiet"]["steps_after"] is None
    rows = {r["workload"]: r for r in _section(client.get(f"/campaigns/{pk}/report.csv").content.decode(),
                                               "Workloads moved")}
    assert rows[first.workload_name]["steps_before"] == str(first.steps_before)
    assert rows[first.workload_name]["steps_after"] == str(first.steps_after)
    assert (rows["quiet"]["steps_before"], rows["quiet"]["steps_after"]) == ("not reported", "not reported")


def test_the_report_prints_the_keys_fingerprint_never_the_key(seeded, make_user, tmp_path: Path):
    """Issue 31: the public key reaches the auditor separately; the report prints its SHA-256
    fingerprint (the key id campaigns.verify and evidence_key print) for the auditor to compare."""
    need(bool(shutil.which("pdftotext")), "needs poppler-utils: scripts/install-system-deps.sh")
    from campaigns import signing

    pk = seeded.campaigns["completed"]
    client = _viewer(make_user)
    pem = signing.public_key_pem()
    body = pem.split("-----")[2].strip()
    data = json.loads(client.get(f"/campaigns/{pk}/report.json").content)
    assert data["verification"]["public_key_sha256"] == signing.key_id() and "public_key" not in data["verification"]
    for fmt in ("json", "csv"):
        text = client.get(f"/campaigns/{pk}/report.{fmt}").content.decode()
        assert "BEGIN PUBLIC KEY" not in text and body not in text
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(client.get(f"/campaigns/{pk}/report.pdf").content)
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True, text=True,
                          timeout=60).stdout
    flat = "".join(text.split())
    assert "BEGINPUBLICKEY" not in flat and "".join(body.split())[:24] not in flat
    assert "publickeyfingerprint(sha-256)" in flat.lower() and signing.key_id() in flat


def _links(page: str) -> set[str]:
    import re

    return set(re.findall(r'href="(/[^"]+\.(?:pdf|csv|json)(?:\?[^"]*)?)"', page.replace("&amp;", "&")))


def test_the_reports_page_lists_every_report_and_each_link_answers(seeded, make_user):
    """Issue 31: one Reports page, in the navigation, with the pending patches (all clusters and
    each one), every advisory's report, every campaign's report and its evidence log."""
    from advisories.models import Advisory

    client = _viewer(make_user)
    response = client.get("/reports/")
    assert response.status_code == 200
    page = response.content.decode()
    assert '<a href="/reports/" aria-current="page">Reports</a>' in page
    links = _links(page)
    assert {"/advisories/pending.pdf", "/advisories/pending.csv", "/advisories/pending.json",
            "/advisories/pending.pdf?cluster=local", "/advisories/pending.pdf?cluster=hpc"} <= links
    for advisory in Advisory.objects.all():
        assert {f"/advisories/{advisory.public_id}/report.{fmt}" for fmt in ("pdf", "csv", "json")} <= links
    for campaign in Campaign.objects.all():
        assert {f"/campaigns/{campaign.pk}/report.{fmt}" for fmt in ("pdf", "csv", "json")} <= links
        assert {f"/campaigns/{campaign.pk}/evidence.{fmt}" for fmt in ("json", "csv")} <= links
    for link in sorted(link for link in links if not link.endswith(".pdf")):
        assert client.get(link).status_code == 200, link
    advisory = Advisory.objects.get(publisher_id="5703")
    for link in ("/advisories/pending.pdf?cluster=local", f"/advisories/{advisory.public_id}/report.pdf"):
        answer = client.get(link)
        assert answer.status_code == 200 and answer.content[:5] == b"%PDF-", link


def test_the_reports_page_filters_by_kind_advisory_status_cluster_and_date(seeded, make_user):
    from advisories.models import Advisory

    client = _viewer(make_user)
    completed = Campaign.objects.get(pk=seeded.campaigns["completed"])
    advisory = Advisory.objects.get(publisher_id="5703")
    other = Advisory.objects.exclude(pk=advisory.pk).first()
    completed.advisories.set([advisory])

    def get(**query: str) -> tuple[str, set[str]]:
        answer = client.get("/reports/", query)
        assert answer.status_code == 200
        return answer.content.decode(), _links(answer.content.decode())

    page, links = get(kind="advisory")
    assert 'id="advisory-reports"' in page and 'id="campaign-reports"' not in page
    assert 'id="pending-reports"' not in page
    page, links = get(kind="evidence")
    assert f"/campaigns/{completed.pk}/evidence.json" in links and f"/campaigns/{completed.pk}/report.pdf" not in links
    page, links = get(kind="campaign")
    assert f"/campaigns/{completed.pk}/report.pdf" in links and f"/campaigns/{completed.pk}/evidence.json" not in links
    # An advisory: its own report and the campaigns that fix it.
    page, links = get(advisory=advisory.public_id)
    assert f"/advisories/{advisory.public_id}/report.pdf" in links
    assert f"/advisories/{other.public_id}/report.pdf" not in links
    assert {link.split("/")[2] for link in links if link.startswith("/campaigns/")} == {str(completed.pk)}
    page, _ = get(advisory="nvidia-0000")
    assert "no advisory &#x27;nvidia-0000&#x27;" in page
    page, links = get(status="completed", kind="campaign")
    assert {link.split("/")[2] for link in links} == {str(completed.pk)}
    page, links = get(kind="pending", cluster="hpc")
    assert links == {f"/advisories/pending.{fmt}?cluster=hpc" for fmt in ("pdf", "csv", "json")}
    # Dates: campaigns created or finished in the range.
    today = completed.created_at.date()
    _page, links = get(kind="campaign", since=str(today), until=str(today))
    assert f"/campaigns/{completed.pk}/report.pdf" in links
    _page, links = get(kind="campaign", until=str(today.replace(year=today.year - 1)))
    assert not links
    page, _ = get(since="yesterday")
    assert "is no date" in page
    page, links = get(q="completed sw", kind="campaign")
    assert {"report.pdf", "report.csv", "report.json"} == {link.split("/")[3] for link in links}
    _page, links = get(q="completed sw")
    assert {link for link in links if link.startswith("/campaigns/")} == {
        f"/campaigns/{completed.pk}/{name}"
        for name in ("report.pdf", "report.csv", "report.json", "evidence.json", "evidence.csv")}


def test_the_advisory_and_exposure_pages_link_their_reports(seeded, make_user):
    from advisories.models import Advisory

    client = _viewer(make_user)
    advisory = Advisory.objects.get(publisher_id="5703")
    page = client.get(f"/advisories/{advisory.public_id}/").content.decode()
    assert f'href="/advisories/{advisory.public_id}/report.pdf"' in page
    page = client.get("/advisories/exposures/", {"cluster": "local"}).content.decode()
    assert 'href="/advisories/pending.pdf?cluster=local"' in page


def test_nobody_without_a_role_sees_the_reports_page(seeded, make_user):
    client = Client()
    client.force_login(make_user("nora"))
    assert client.get("/reports/").status_code == 403
