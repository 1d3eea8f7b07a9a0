"""Campaigns from distribution advisories (issue 30, item 5): created for a USN through the API,
planned per node from advisories.osplan (a livepatch where Livepatch notice LSN-0066-1 covers the
running kernel: no drain, no checkpoint; the fixed kernel and a reboot for the rest), and run by the
engine on the memory executor (a test double: the engine's step order, the service states and the
remediation are what is tested here; the agent's livepatch method is tested on a real agent in
tests/campaigns/test_os_campaign_agents.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from advisories.ingest import ingest_documents
from advisories.models import Exposure
from advisories.sources import resolve
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.models import EvidenceEvent, NodeSweep
from executors.memory import Fleet
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.packages import apply_os_report, parse_os_report
from inventory.versions import parse_version
from tests.advisories.test_osmatch import BIONIC, bionic_kernel_usn, kernel_packages
from tests.advisories.test_osv_ingest import OSV
from tests.campaigns.fleet import drive, user

pytestmark = pytest.mark.django_db
BASE = "/api/v1/campaigns/campaigns/"
COVERED, TOO_OLD, SPARE = "4.15.0-70-generic", "4.15.0-60-generic", "4.15.0-99-generic"


def add_node(
    fleet: Fleet, cluster: Cluster, name: str, kernel: str, *, sweep: bool = True, engine: str = "criu"
) -> Node:
    """A bionic node running `kernel` with one 2-GPU workload (none on a spare), in the inventory
    (components, its agent's OS report) and in the memory fleet."""
    node = Node.objects.create(
        cluster=cluster, name=name, gpu_model="H100", gpu_count=8, labels={"sweep": "yes" if sweep else "no"}
    )
    versions = {"driver": "570.195.03", "cuda": "12.8", "kernel": kernel}
    for component, version in versions.items():
        parsed = parse_version(component, version)
        NodeComponent.objects.create(
            node=node, component=component, version=version, version_key=parsed.key, branch=parsed.branch
        )
    fleet.add_node(cluster.name, name, gpu_model="H100", gpu_count=8, versions=versions)
    abi = kernel.rsplit("-", 1)[0]
    report = {
        "release": BIONIC,
        "running_kernel": kernel,
        "packages": kernel_packages(abi, f"{abi}.{int(abi.rsplit('-', 1)[1]) + 9}", "generic", "linux"),
        "livepatch": {"tool": "canonical-livepatch", "state": "nothing-to-apply", "version": "65", "fixes": []},
    }
    apply_os_report(node.pk, parse_os_report({"os": report}), "agent")
    if sweep:
        ref = f"{name}-w0"
        Workload.objects.create(
            cluster=cluster,
            node=node,
            kind="process",
            scheduler_id=ref,
            name=f"job-{ref}",
            gpus=2,
            checkpoint_engine=engine,
        )
        fleet.add_workload(cluster.name, name, ref, name=f"job-{ref}", gpus=2, engine=engine, rate=1000)
    return node


@pytest.fixture
def fleet(tmp_path: Any) -> dict[str, Node]:
    fleet = Fleet()
    fleet.reset()
    cluster = Cluster.objects.create(name="dgx", kind="static", connection={"executor": "memory"})
    nodes = {
        "covered": add_node(fleet, cluster, "covered", COVERED),
        "too-old": add_node(fleet, cluster, "too-old", TOO_OLD, engine="signal"),
        "spare": add_node(fleet, cluster, "spare", SPARE, sweep=False),
    }
    ingest_documents(resolve(str(bionic_kernel_usn(tmp_path))).items())  # USN-9999-1: bionic's linux < 4.15.0-99
    ingest_documents(resolve(str(OSV / "LSN-0066-1.json")).items())  # livepatch 66 for 4.15.0-69 and later
    return nodes


def login(name: str, *roles: str) -> Client:
    user(name, *roles)
    client = Client()
    assert client.login(username=name, password=f"pw-{name}-123456")
    return client


def test_a_usn_campaign_livepatches_covered_nodes_in_place_and_reboots_the_rest(
    fleet, django_capture_on_commit_callbacks
):
    operator, approver = login("olga", "operator"), login("abe", "approver")
    covered, too_old = fleet["covered"], fleet["too-old"]
    assert {e.node.name: e.state for e in Exposure.objects.select_related("node")} == {
        "covered": "open",
        "too-old": "open",
    }
    created = operator.post(
        BASE,
        {
            "name": "bionic kernel",
            "advisories": ["ubuntu-usn-9999-1"],
            "node_selector": {"sweep": "yes"},
            "canary": "0",
            "parallelism_per_cluster": "2",
        },
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    url = f"{BASE}{created.json()['id']}/"
    plan = operator.post(url + "plan/", {}, content_type="application/json").json()["content"]
    nodes = {n["name"]: n for n in plan["nodes"].values()}
    assert set(nodes) == {"covered", "too-old"}, plan["skipped"]
    # Where the notice covers the running kernel: the livepatch alone, the work staying put.
    assert nodes["covered"]["remedy"] == "livepatch" and nodes["covered"]["target"] == {"livepatch": "66"}
    assert nodes["covered"]["steps"] == ["pending", "patching", "verifying", "done"]
    assert nodes["covered"]["moves"] == [] and [s["workload"] for s in nodes["covered"]["stays"]] == ["covered-w0"]
    # Below the notice's base kernel: the fixed kernel (its uname -r names the package) and a reboot, with
    # the usual drain and checkpoint; the distribution's fix for its release is named.
    assert nodes["too-old"]["remedy"] == "reboot" and nodes["too-old"]["target"] == {"kernel": SPARE}
    assert nodes["too-old"]["os_packages"] == {"linux": "4.15.0-99.100"}
    assert "draining" in nodes["too-old"]["steps"] and nodes["too-old"]["moves"][0]["action"] == "migrate"
    assert plan["summary"]["livepatch_only"] == 1

    assert approver.post(url + "approve/").status_code == 200
    assert operator.post(url + "start/").status_code == 200
    states: dict[str, list[str]] = {"covered": [], "too-old": []}
    service: dict[str, set[str]] = {"covered": set(), "too-old": set()}
    campaign_id = created.json()["id"]
    # Step by step, watching each node's steps and service state as an operator would.
    from campaigns import engine

    with django_capture_on_commit_callbacks(execute=True):  # the exposures follow the inventory on commit
        for _ in range(40):
            engine.dispatch(campaign_id)
            for sweep in NodeSweep.objects.filter(campaign_id=campaign_id).select_related("node"):
                states[sweep.node.name].append(sweep.state)
                service[sweep.node.name].add(sweep.node.service_state)
                if sweep.state in SweepState.WORKING:
                    engine.advance(sweep.pk, max_steps=1)
        done = drive(campaign_id)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason

    seen = {name: list(dict.fromkeys(s)) for name, s in states.items()}
    assert seen["covered"] == ["patching", "verifying", "done"]
    assert service["covered"] == {ServiceState.IN_SERVICE}  # never drained
    assert seen["too-old"][:3] == ["draining", "checkpointing", "migrating"] and "rebooting" in seen["too-old"]
    fleet_state = Fleet()
    with fleet_state.store.edit("nodes", "dgx/covered") as data:
        assert data["reboots"] == 0 and data["versions"]["livepatch"] == "66" and not data["maintenance"]
        assert data["workloads"]["covered-w0"]["state"] == "running"  # never checkpointed nor stopped
    with fleet_state.store.edit("nodes", "dgx/too-old") as data:
        assert data["reboots"] == 1 and data["versions"]["kernel"] == SPARE
    covered_sweep = NodeSweep.objects.get(campaign_id=campaign_id, node=covered)
    kinds = list(EvidenceEvent.objects.filter(sweep=covered_sweep).values_list("kind", flat=True))
    assert EvidenceKind.CHECKPOINTED not in kinds and EvidenceKind.HEALTH_CHECKED not in kinds

    # Both exposures remediated, credited to the campaign's sweeps; the inventory knows what runs.
    for node in (covered, too_old):
        exposure = Exposure.objects.get(node=node)
        sweep = NodeSweep.objects.get(campaign_id=campaign_id, node=node)
        assert exposure.state == "remediated", (node.name, exposure.note)
        assert exposure.remediated_by == f"campaign {campaign_id}, sweep {sweep.pk}"
    covered.refresh_from_db()
    too_old.refresh_from_db()
    assert covered.livepatch["state"] == "applied" and covered.livepatch["version"] == "66"
    assert too_old.running_kernel == SPARE and too_old.service_state == ServiceState.IN_SERVICE
    # The campaign's report says what each node got, and the USN's report credits the sweeps.
    report = operator.get(f"/campaigns/{campaign_id}/report.json").json()
    nodes_done = {n["node"]: (n["remedy"], n["target"], n["state"]) for n in report["nodes"]}
    assert nodes_done == {
        "covered": ("livepatch", {"livepatch": "66"}, "done"),
        "too-old": ("reboot", {"kernel": SPARE}, "done"),
    }
    usn = operator.get("/advisories/ubuntu-usn-9999-1/report.json").json()
    assert {r["node"]: (r["component"], r["state"]) for r in usn["exposures"]} == {
        "covered": ("package linux", "remediated"),
        "too-old": ("package linux", "remediated"),
    }
    assert operator.get(f"/campaigns/{campaign_id}/report.pdf").content.startswith(b"%PDF")


def test_a_failed_livepatch_leaves_the_node_in_service_with_its_work(fleet):
    requester, approver = user("rita", "operator"), user("alan", "approver")
    from advisories.models import Advisory
    from campaigns import services
    from campaigns.models import Campaign

    Fleet().inject("patch", "dgx/covered", "permanent")
    campaign = Campaign.objects.create(
        name="lp", requested_by=requester, node_selector={"names": ["covered"]}, canary="0", error_budget="1"
    )
    campaign.advisories.set(Advisory.objects.filter(publisher_id="USN-9999-1"))
    services.make_plan(campaign.pk, requester)
    services.approve(campaign.pk, approver)
    services.start(campaign.pk, requester)
    drive(campaign.pk)
    sweep = NodeSweep.objects.get(campaign=campaign)
    assert sweep.state == SweepState.FAILED
    failed = EvidenceEvent.objects.get(sweep=sweep, kind=EvidenceKind.FAILED).data
    assert failed["left"] == "in service, its work untouched (livepatch)"
    assert Node.objects.get(name="covered").service_state == ServiceState.IN_SERVICE
    with Fleet().store.edit("nodes", "dgx/covered") as data:
        assert data["reboots"] == 0 and data["workloads"]["covered-w0"]["state"] == "running"
    assert Exposure.objects.get(node__name="covered").state == "open"


def test_the_wizard_offers_the_usn_and_previews_the_livepatch(fleet, settings):
    settings.GPUSWEEP_CONSOLE_FIGURES_S = 0  # the exposed counts as they are now, as tests/ui does
    operator = login("otto", "operator")
    page = operator.get("/campaigns/new/?advisories=ubuntu-usn-9999-1").content.decode()
    assert 'value="ubuntu-usn-9999-1" id="adv-ubuntu-usn-9999-1" checked' in page
    row = page[page.index('id="adv-ubuntu-usn-9999-1"') :][:600]
    assert '<td class="num">2</td>' in row  # its two exposed nodes
    body = {
        "name": "bionic kernel",
        "advisories": ["ubuntu-usn-9999-1"],
        "clusters": ["dgx"],
        "node_names": "covered,too-old",
        "parallelism_per_cluster": "2",
        "error_budget": "1",
        "workload_policy": "checkpoint",
        "canary": "0",
        "soak_s": "0",
        "approvals_required": "1",
    }
    preview = operator.post("/campaigns/new/preview/", body).content.decode()
    assert "livepatch: no drain, no checkpoint, no reboot" in preview and "job-covered-w0: stays running" in preview
    assert "1 node livepatched in place" in preview
    created = operator.post("/campaigns/new/", {**body, "then": "draft"})
    assert created.status_code == 302
    from campaigns.models import Campaign

    assert [a.public_id for a in Campaign.objects.get().advisories.all()] == ["ubuntu-usn-9999-1"]


def test_a_livepatch_the_agent_reported_before_the_campaign_is_credited_to_the_agent(
    fleet, django_capture_on_commit_callbacks
):
    """The livepatch service applied LSN-0066-1's patch by itself (canonical-livepatch does, unasked) and
    the node's agent reported it before the campaign's livepatch step: the remediation is the agent's,
    and the campaign that then runs on the node takes nothing away from it. On the node the campaign
    livepatched first, the agent's later report leaves the campaign's credit."""
    requester, approver = user("rita", "operator"), user("alan", "approver")
    from advisories.models import Advisory
    from campaigns import services
    from campaigns.models import Campaign

    campaign = Campaign.objects.create(
        name="lp", requested_by=requester, node_selector={"names": ["covered"]}, canary="0"
    )
    campaign.advisories.set(Advisory.objects.filter(publisher_id="USN-9999-1"))
    plan = services.make_plan(campaign.pk, requester).content["nodes"]
    assert plan[str(fleet["covered"].pk)]["target"] == {"livepatch": "66"}
    services.approve(campaign.pk, approver)
    covered = fleet["covered"]
    abi = COVERED.rsplit("-", 1)[0]
    applied = {
        "release": BIONIC,
        "running_kernel": COVERED,
        "packages": kernel_packages(abi, f"{abi}.79", "generic", "linux"),
        "livepatch": {"tool": "canonical-livepatch", "state": "applied", "version": "66", "fixes": []},
    }
    with django_capture_on_commit_callbacks(execute=True):
        apply_os_report(covered.pk, parse_os_report({"os": applied}), "agent")
    exposure = Exposure.objects.get(node=covered)
    assert (exposure.state, exposure.remediated_by, exposure.note) == ("remediated", "agent", "livepatch LSN-0066-1")

    with django_capture_on_commit_callbacks(execute=True):
        services.start(campaign.pk, requester)
        done = drive(campaign.pk)
    assert done.status == CampaignStatus.COMPLETED, done.status_reason
    assert NodeSweep.objects.get(campaign=campaign).state == SweepState.DONE
    exposure.refresh_from_db()
    assert (exposure.state, exposure.remediated_by) == ("remediated", "agent")

    # The other way round: the campaign's livepatch first, then the agent's report of it.
    too_old_campaign = Campaign.objects.create(
        name="lp2", requested_by=requester, node_selector={"names": ["too-old"]}, canary="0"
    )
    too_old_campaign.advisories.set(Advisory.objects.filter(publisher_id="USN-9999-1"))
    services.make_plan(too_old_campaign.pk, requester)
    services.approve(too_old_campaign.pk, approver)
    with django_capture_on_commit_callbacks(execute=True):
        services.start(too_old_campaign.pk, requester)
        assert drive(too_old_campaign.pk).status == CampaignStatus.COMPLETED
    sweep = NodeSweep.objects.get(campaign=too_old_campaign)
    credited = f"campaign {too_old_campaign.pk}, sweep {sweep.pk}"
    assert Exposure.objects.get(node=fleet["too-old"]).remediated_by == credited
    booted = {**applied, "running_kernel": SPARE,
              "packages": kernel_packages("4.15.0-99", "4.15.0-99.100", "generic", "linux")}
    with django_capture_on_commit_callbacks(execute=True):
        apply_os_report(fleet["too-old"].pk, parse_os_report({"os": booted}), "agent")
    assert Exposure.objects.get(node=fleet["too-old"]).remediated_by == credited
