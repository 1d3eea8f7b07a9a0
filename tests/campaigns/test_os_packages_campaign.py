"""Campaigns that install a distribution's exact fix (issue 30, done-when 2): a packaged NVIDIA driver
(Ubuntu 22.04's nvidia-graphics-drivers-515-server below USN-5547-1's fix, exposed by NVIDIA's bulletin
5383 too: one finding, two sources) gets every installed binary of the source at the USN's version for
jammy, with the drain and reboot a driver needs; another package an advisory names (openssl) is updated
in place, no drain. Run by the engine on the memory executor (a test double: the step order, the
packages asked for, the remediation and its credit are what is tested here; the agent's side, its
command template and its read-back, on real agents in tests/campaigns/test_os_campaign_agents.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from advisories.findings import findings
from advisories.ingest import ingest_documents
from advisories.models import Advisory, Exposure
from advisories.sources import resolve
from campaigns import services
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep
from executors.memory import Fleet
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.packages import apply_os_report, parse_os_report
from inventory.versions import parse_version
from tests.advisories.test_osmatch import DRIVER_FIXED, DRIVER_OLD, JAMMY
from tests.advisories.test_osv_ingest import OSV, record, write
from tests.campaigns.fleet import drive, user

pytestmark = pytest.mark.django_db
SOURCE = "nvidia-graphics-drivers-515-server"
BINARIES = ("libnvidia-compute-515-server", "nvidia-driver-515-server", "nvidia-kernel-common-515-server")
SSL_OLD, SSL_FIXED = "3.0.2-0ubuntu1.10", "3.0.2-0ubuntu1.15"


def driver_set(version: str) -> list[list[str]]:
    """The driver's binaries as dpkg-query lists them (source and its version), and a bystander."""
    return [["bash", "5.1-6ubuntu1", "amd64", "bash", "5.1-6ubuntu1"],
            *([name, version, "amd64", SOURCE, version] for name in BINARIES)]


def ssl_set(version: str) -> list[list[str]]:
    return [["bash", "5.1-6ubuntu1", "amd64", "bash", "5.1-6ubuntu1"],
            ["libssl3", version, "amd64", "openssl", version], ["openssl", version, "amd64", "openssl", version]]


def openssl_usn(folder: Path) -> Path:
    """A jammy openssl USN (USN-5547-1's shape with openssl's source, binaries and fix)."""
    data = record("USN-5547-1.json")
    data["id"] = "USN-9998-1"
    affected = next(a for a in data["affected"] if a["package"]["ecosystem"] == "Ubuntu:22.04:LTS")
    affected["package"] = {"ecosystem": "Ubuntu:22.04:LTS", "name": "openssl"}
    affected["ranges"][0]["events"] = [{"introduced": "0"}, {"fixed": SSL_FIXED}]
    affected["ecosystem_specific"]["binaries"] = [{"binary_name": b, "binary_version": SSL_FIXED}
                                                  for b in ("libssl3", "openssl")]
    affected.pop("versions", None)
    data["affected"] = [affected]
    return write(folder, "USN-9998-1.json", data)


def report(node: Node, packages: list[list[str]], reference: str = "agent") -> None:
    """The node's agent's OS report, applied as a heartbeat would (exposures follow on commit)."""
    apply_os_report(node.pk, parse_os_report({"os": {"release": JAMMY, "running_kernel": "5.15.0-91-generic",
                                                     "packages": packages}}), reference)


def add_node(fleet: Fleet, cluster: Cluster, name: str, packages: list[list[str]], driver: str) -> Node:
    node = Node.objects.create(cluster=cluster, name=name, gpu_model="H100", gpu_count=8, labels={"sweep": "yes"})
    versions = {"driver": driver, "cuda": "12.8", "kernel": "5.15.0-91-generic"}
    for component, version in versions.items():
        parsed = parse_version(component, version)
        NodeComponent.objects.create(node=node, component=component, version=version, version_key=parsed.key,
                                     branch=parsed.branch)
    fleet.add_node(cluster.name, name, gpu_model="H100", gpu_count=8, versions=versions)
    report(node, packages)
    ref = f"{name}-w0"
    Workload.objects.create(cluster=cluster, node=node, kind="process", scheduler_id=ref, name=f"job-{ref}", gpus=2,
                            checkpoint_engine="criu")
    fleet.add_workload(cluster.name, name, ref, name=f"job-{ref}", gpus=2, engine="criu", rate=1000)
    return node


@pytest.fixture
def fleet(tmp_path: Any, django_capture_on_commit_callbacks: Any) -> dict[str, Node]:
    fleet = Fleet()
    fleet.reset()
    cluster = Cluster.objects.create(name="dgx", kind="static", connection={"executor": "memory"})
    with django_capture_on_commit_callbacks(execute=True):
        nodes = {"packaged": add_node(fleet, cluster, "packaged", driver_set(DRIVER_OLD), "515.48.07"),
                 "library": add_node(fleet, cluster, "library", ssl_set(SSL_OLD), "515.65.01")}
        # Room for the packaged node's workload while it is drained.
        fleet.add_node(cluster.name, "spare", gpu_model="H100", gpu_count=8,
                       versions={"driver": "515.48.07", "cuda": "12.8", "kernel": "5.15.0-91-generic"})
        spare = Node.objects.create(cluster=cluster, name="spare", gpu_model="H100", gpu_count=8)
        for component, version in {"driver": "515.48.07", "cuda": "12.8", "kernel": "5.15.0-91-generic"}.items():
            parsed = parse_version(component, version)
            NodeComponent.objects.create(node=spare, component=component, version=version, version_key=parsed.key,
                                         branch=parsed.branch)
        for path in (OSV / "nvidia-5383.json", OSV / "USN-5547-1.json", openssl_usn(Path(tmp_path))):
            ingest_documents(resolve(str(path)).items())
    return nodes


def test_a_packaged_driver_gets_the_usns_exact_packages_and_is_remediated_credited_to_the_campaign(
        fleet, django_capture_on_commit_callbacks):
    packaged, library = fleet["packaged"], fleet["library"]
    [cve] = [f for f in findings(node_ids=[packaged.pk]) if f.cve_id == "CVE-2022-31607"]
    assert sorted((s.publisher_id, s.state) for s in cve.sources) == [("5383", "open"), ("USN-5547-1", "open")]
    requester, approver = user("rita", "operator"), user("alan", "approver")
    campaign = Campaign.objects.create(name="usn", requested_by=requester, node_selector={"sweep": "yes"},
                                       canary="0", parallelism_per_cluster="2")
    campaign.advisories.set(Advisory.objects.all())
    plan = services.make_plan(campaign.pk, requester).content["nodes"]

    # The driver: the USN's upstream version as the driver component (the driver groups' rules, drained
    # and rebooted), installed as every binary of the source the node has, at the fix for jammy.
    driver = plan[str(packaged.pk)]
    assert driver["target"] == {"driver": "515.65.01"} and driver["remedy"] == "packages"
    assert driver["os_install"] == {"driver": {name: DRIVER_FIXED for name in BINARIES}}
    assert "draining" in driver["steps"] and "rebooting" in driver["steps"]
    # Another package: updated in place, its work staying put, no drain, no reboot.
    lib = plan[str(library.pk)]
    assert set(lib["target"]) == {"packages"} and lib["in_place"]
    assert lib["os_install"] == {"packages": {"libssl3": SSL_FIXED, "openssl": SSL_FIXED}}
    assert lib["steps"] == ["pending", "patching", "verifying", "done"] and lib["moves"] == []
    assert "keep the packages' old code until they restart" in " ".join(lib["risks"])

    # The operator's page says which node keeps its work while its packages are updated.
    from django.test import Client

    page = Client()
    page.force_login(requester)
    text = page.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert "1 node with packages updated in place" in text
    row = text[text.index("<strong>dgx/library</strong>"):][:800]
    assert "packages updated in place: no drain, no checkpoint, no reboot" in row

    services.approve(campaign.pk, approver)
    with django_capture_on_commit_callbacks(execute=True):
        services.start(campaign.pk, requester)
        done = drive(campaign.pk)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    with Fleet().store.edit("nodes", "dgx/packaged") as data:
        assert data["packages"] == {name: DRIVER_FIXED for name in BINARIES} and data["reboots"] == 1
    with Fleet().store.edit("nodes", "dgx/library") as data:
        assert data["packages"] == {"libssl3": SSL_FIXED, "openssl": SSL_FIXED}
        assert data["reboots"] == 0 and not data["maintenance"]
        assert data["workloads"]["library-w0"]["state"] == "running"  # never checkpointed nor stopped

    # Both sources of the driver's finding and the library's exposure: remediated, credited to the sweeps.
    for node in (packaged, library):
        sweep = NodeSweep.objects.get(campaign=campaign, node=node)
        assert sweep.state == SweepState.DONE
        credited = f"campaign {campaign.pk}, sweep {sweep.pk}"
        assert {(e.advisory.publisher_id, e.state, e.remediated_by)
                for e in Exposure.objects.filter(node=node).select_related("advisory")} == (
            {("5383", "remediated", credited), ("USN-5547-1", "remediated", credited)} if node == packaged
            else {("USN-9998-1", "remediated", credited)})
    [cve] = [f for f in findings(node_ids=[packaged.pk]) if f.cve_id == "CVE-2022-31607"]
    assert cve.state == "remediated" and [s.publisher for s in cve.deciding] == ["Ubuntu"]
    assert Exposure.objects.get(node=packaged, advisory__publisher_id="USN-5547-1").fixed_by_version == DRIVER_FIXED
    library.refresh_from_db()
    assert library.service_state == ServiceState.IN_SERVICE
    assert not EvidenceEvent.objects.filter(sweep__node=library, kind=EvidenceKind.CHECKPOINTED).exists()

    # The agent's next report says what the campaign installed: nothing changes, the credit stays.
    with django_capture_on_commit_callbacks(execute=True):
        report(packaged, driver_set(DRIVER_FIXED))
        report(library, ssl_set(SSL_FIXED))
    assert set(Exposure.objects.filter(node__in=[packaged, library]).values_list("remediated_by", flat=True)) == {
        f"campaign {campaign.pk}, sweep {s.pk}" for s in NodeSweep.objects.filter(campaign=campaign)}


def test_an_agent_report_that_arrives_before_the_verify_step_still_credits_the_campaign(
        fleet, django_capture_on_commit_callbacks):
    """The rebooted node's agent reports its new packages before the engine verifies it: the campaign
    caused the update, so the remediation is the campaign's, not the agent's."""
    from campaigns import engine

    packaged = fleet["packaged"]
    requester, approver = user("rita", "operator"), user("alan", "approver")
    campaign = Campaign.objects.create(name="usn", requested_by=requester, node_selector={"names": ["packaged"]},
                                       canary="0")
    campaign.advisories.set(Advisory.objects.filter(publisher_id="USN-5547-1"))
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    with django_capture_on_commit_callbacks(execute=True):
        services.start(campaign.pk, requester)
        for _ in range(60):
            engine.dispatch(campaign.pk)
            sweep = NodeSweep.objects.get(campaign=campaign)
            if sweep.state == SweepState.VERIFYING:
                break
            if sweep.state in SweepState.WORKING:
                engine.advance(sweep.pk, max_steps=1)
    assert sweep.state == SweepState.VERIFYING
    with django_capture_on_commit_callbacks(execute=True):
        report(packaged, driver_set(DRIVER_FIXED))  # the heartbeat after the reboot
    assert Exposure.objects.get(node=packaged, advisory__publisher_id="USN-5547-1").remediated_by == "agent"
    with django_capture_on_commit_callbacks(execute=True):
        done = drive(campaign.pk)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    usn = Exposure.objects.get(node=packaged, advisory__publisher_id="USN-5547-1")
    assert usn.remediated_by == f"campaign {campaign.pk}, sweep {sweep.pk}"
