"""Exposures of a real fleet to NVIDIA 5703: exact rows and deadlines, remediation, overrides."""

from __future__ import annotations

import datetime as dt

import pytest

from advisories.exposure import assign_deadlines, recompute
from advisories.ingest import FetchedDocument, ingest_document
from advisories.kev import import_catalogue
from advisories.models import Advisory, ClusterDeadlineOverride, DeadlinePolicy, Exposure
from inventory.models import Cluster
from inventory.signals import node_versions_changed
from tests.advisories.conftest import FIXTURES, PUBLISHED_5703, add_node, set_version

pytestmark = pytest.mark.django_db

# (node, driver version, exposed?) for Linux Tesla nodes; 5703 fixes 580.95.05, 570.195.03, 535.274.02.
FLEET = [
    ("r535-below", "535.261.03", True),
    ("r535-at", "535.274.02", False),
    ("r535-above", "535.288.01", False),
    ("r570-below", "570.172.08", True),
    ("r570-at", "570.195.03", False),
    ("r570-above", "570.211.01", False),
    ("r580-below", "580.82.07", True),
    ("r580-at", "580.95.05", False),
    ("r580-above", "580.105.08", False),
    ("r560-unlisted", "560.35.03", False),  # a branch the bulletin skips: presumed, not open
]


def ingest(*ids: str) -> None:
    for bulletin in ids:
        path = FIXTURES / f"{bulletin}.json"
        ingest_document(FetchedDocument(str(path), path.read_bytes(), "file"))


@pytest.fixture
def fleet() -> Cluster:
    cluster = Cluster.objects.create(name="prod", kind="slurm")
    for name, version, _ in FLEET:
        add_node(cluster, name, driver=version, container_toolkit="1.17.8")
    return cluster


def open_exposures() -> set[tuple[str, str, str]]:
    return set(Exposure.objects.filter(state="open").values_list("node__name", "affected_range__branch",
                                                                  "detected_version"))


def test_it_exposes_exactly_the_nodes_below_each_fixed_version(fleet):
    ingest("5703")
    assert open_exposures() == {(n, f"R{v[:3]}", v) for n, v, exposed in FLEET if exposed}
    presumed = Exposure.objects.get(state="presumed")
    assert presumed.node.name == "r560-unlisted"
    assert presumed.affected_range.remediation == "move to a supported branch: R570 570.195.03 or R535 535.274.02"
    for exposure in Exposure.objects.filter(state="open"):
        assert exposure.advisory.publisher_id == "5703"
        assert exposure.affected_range.product_line == "tesla" and exposure.affected_range.os_family == "linux"
        assert exposure.severity == "high"
        assert exposure.deadline == PUBLISHED_5703 + dt.timedelta(days=30)
        assert exposure.deadline_source == "policy: high 30 days from publication"
        assert exposure.affected_range.cves.count() == 6


def test_a_node_added_after_ingest_is_matched_when_its_versions_change(fleet):
    ingest("5703")
    late = add_node(fleet, "late", driver="580.65.06")
    node_versions_changed.send(sender=None, node_ids=[late.id])
    assert Exposure.objects.filter(node=late, state="open").count() == 1


def test_os_and_product_line_must_match(fleet):
    windows = add_node(fleet, "win", driver="580.88")  # Windows R580 Tesla: fixed in 581.42
    windows.os_family = "windows"
    windows.save()
    workstation = add_node(fleet, "ws", driver="580.82.07")
    workstation.product_line = "geforce"
    workstation.save()
    ingest("5703")
    rows = {n: (r.os_family, r.product_line, r.fixed_version) for n, r in
            ((e.node.name, e.affected_range) for e in Exposure.objects.filter(node__name__in=["win", "ws"]))}
    assert rows == {"win": ("windows", "tesla", "581.42"), "ws": ("linux", "geforce", "580.95.05")}


def test_an_upgraded_node_is_remediated_with_evidence(fleet):
    ingest("5703")
    node = fleet.nodes.get(name="r580-below")
    exposure = Exposure.objects.get(node=node)
    set_version(node, "driver", "580.95.05")
    node_versions_changed.send(sender=None, node_ids=[node.id])
    exposure.refresh_from_db()
    assert exposure.state == "remediated"
    assert exposure.fixed_by_version == "580.95.05"
    assert exposure.detected_version == "580.82.07"
    assert exposure.remediated_at is not None
    # Idempotent: a second pass changes nothing.
    stamp = exposure.updated_at
    result = recompute()
    exposure.refresh_from_db()
    assert (result.opened, result.reopened, result.remediated) == (0, 0, 0)
    assert exposure.updated_at == stamp
    # A downgrade back into the range opens it again.
    set_version(node, "driver", "580.76.05")
    recompute(node_ids=[node.id])
    exposure.refresh_from_db()
    assert (exposure.state, exposure.detected_version, exposure.fixed_by_version) == ("open", "580.76.05", "")


def test_an_unparseable_version_is_not_taken_for_a_patch(fleet):
    ingest("5703")
    node = fleet.nodes.get(name="r570-below")
    set_version(node, "driver", "570-custom-build")
    recompute(node_ids=[node.id])
    assert Exposure.objects.get(node=node).state == "open"


def test_a_gone_node_keeps_its_exposure_open(fleet):
    ingest("5703")
    node = fleet.nodes.get(name="r535-below")
    node.gone_at = PUBLISHED_5703
    node.save()
    recompute()
    assert Exposure.objects.get(node=node).state == "open"


def test_container_toolkit_ranges_match_the_toolkit_component(fleet):
    old = add_node(fleet, "old-toolkit", driver="580.95.05", container_toolkit="1.16.1")
    add_node(fleet, "new-toolkit", driver="580.95.05", container_toolkit="1.16.2")
    ingest("5582")
    rows = list(Exposure.objects.values_list("node__name", "component", "severity"))
    assert rows == [("old-toolkit", "container_toolkit", "critical")]
    assert Exposure.objects.get(node=old).deadline == Advisory.objects.get(
        publisher_id="5582").initial_release_date + dt.timedelta(days=15)


def test_deadlines_follow_policy_basis_cluster_overrides_and_kev(fleet):
    ingest("5703")
    exposure = Exposure.objects.get(node__name="r570-below")
    policy = DeadlinePolicy.current()
    policy.basis = "first_exposure"
    policy.save()
    assign_deadlines(refresh=True)
    exposure.refresh_from_db()
    assert exposure.deadline == exposure.first_seen + dt.timedelta(days=30)
    ClusterDeadlineOverride.objects.create(cluster=fleet, severity="high", days=7)
    assign_deadlines(refresh=True)
    exposure.refresh_from_db()
    assert exposure.deadline == exposure.first_seen + dt.timedelta(days=7)
    assert exposure.deadline_source == "cluster override: high 7 days from first exposure"
    catalogue = {"vulnerabilities": [{"cveID": "CVE-2025-23280", "vulnerabilityName": "test", "dateAdded":
                                      "2025-10-20", "dueDate": "2025-11-03"}]}
    import json

    assert import_catalogue(json.dumps(catalogue).encode(), "kev.json") == 1
    exposure.refresh_from_db()
    assert exposure.deadline == dt.datetime(2025, 11, 3, 23, 59, 59, tzinfo=dt.UTC)
    assert exposure.deadline_source == "CISA KEV due date for CVE-2025-23280"


def test_expired_risk_acceptance_opens_the_exposure_again(fleet):
    ingest("5703")
    exposure = Exposure.objects.get(node__name="r535-below")
    exposure.state = "risk_accepted"
    exposure.risk_reason = "air-gapped"
    exposure.risk_expires_at = PUBLISHED_5703
    exposure.save()
    recompute(node_ids=[exposure.node_id])
    exposure.refresh_from_db()
    assert exposure.state == "open"


def test_several_bulletins_hit_an_old_node(fleet):
    ingest("5614", "5670", "5703")
    old = add_node(fleet, "ancient", driver="535.183.01")
    recompute(node_ids=[old.id])
    assert set(Exposure.objects.filter(node=old).values_list("advisory__publisher_id", flat=True)) == {
        "5614", "5670", "5703"}


def test_deleting_a_node_or_an_advisory_removes_its_exposures(fleet):
    ingest("5703")
    node = fleet.nodes.get(name="r580-below")
    node.delete()
    # r535-below, r570-below, and r560-unlisted presumed (5703 skips R560 between R535 and R570)
    assert Exposure.objects.count() == 3
    Advisory.objects.get(publisher_id="5703").delete()
    assert Exposure.objects.count() == 0


def test_a_batch_matches_once_and_catches_up_an_advisory_left_unmatched(fleet):
    from advisories.ingest import ingest_documents
    from advisories.sources import FolderSource

    ingest_documents(FolderSource(str(FIXTURES)).items())
    assert Exposure.objects.filter(advisory__publisher_id="5703", state="open").count() == 3
    assert not Advisory.objects.filter(exposures_at__isnull=True).exists()
    # As if the exposure step of an earlier batch had failed after the documents committed:
    Exposure.objects.filter(advisory__publisher_id="5703").delete()
    Advisory.objects.filter(publisher_id="5703").update(exposures_at=None)
    summary = ingest_documents(FolderSource(str(FIXTURES)).items())
    assert summary.unchanged == 6
    assert Exposure.objects.filter(advisory__publisher_id="5703", state="open").count() == 3
