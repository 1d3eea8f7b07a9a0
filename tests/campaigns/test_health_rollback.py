"""Health gates and rollback (issue 19, items 3 and 4; "Done when" 2 and 3).

Through real node agents (agent/, one process per node) and the local executor, with real
scripts: a site health check that a node fails, and a patch script that upgrades half the
packages and then fails. The agents' reboot and package patch are their simulated ones, and
the package manager is the agent's recording stand-in (gpusweep_agent.packages), since no
package may be installed on this machine. The rollback campaign runs on the memory executor
(a test double; what is tested there is the campaign it creates, not a node).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from campaigns import services
from campaigns.choices import AfterRollback, CampaignStatus, EvidenceKind, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.versions import parse_version
from tests.campaigns.fleet import FIXED, OLD, approved_campaign, drive, make_fleet, user
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "agent" / "tests"))
import agent_helpers as agents

pytestmark = pytest.mark.django_db
ECC = "GPU 3: 12 uncorrectable ECC errors since boot (volatile)"


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver")


class Nodes:
    """Real agents under one root, each with its recording package database, and their inventory nodes."""

    def __init__(self, root: Path, settings: Any) -> None:
        self.root = root
        settings.GPUSWEEP_AGENT_FLEET_SECRET = agents.FLEET_SECRET  # the service signs for these agents
        self.health_options, self.fail = agents.site_check(root)
        self.agents: dict[str, agents.AgentProcess] = {}
        self.cluster = Cluster.objects.create(name=agents.CLUSTER, kind="static", connection={
            "executor": "local", "executor_options": {"operation_timeout": 60}})

    def db(self, name: str) -> Path:
        return self.root / f"packages-{name}.json"

    def add(self, name: str, **settings: str) -> agents.AgentProcess:
        self.db(name).write_text(json.dumps({"installed": {"nvidia-driver-570": f"{OLD}-1",
                                                           "nvidia-utils-570": f"{OLD}-1"}}))
        agent = agents.AgentProcess(self.root, name, self.root / "artifacts", **{
            "reboot_command": "simulate", "patch_methods": '{"package": {"simulate": true}}',
            "health_options": self.health_options, "package_manager": "recording",
            "package_db": str(self.db(name)), **agents.NO_SCHEDULER, **settings}).start()
        self.agents[name] = agent
        node = Node.objects.create(cluster=self.cluster, name=name, gpu_model=agents.FACTS["gpu_model"],
                                   gpu_count=8, agent_endpoint=f"http://127.0.0.1:{agent.port}",
                                   labels={"sweep": "yes"})
        for component, version in {"driver": OLD, "cuda": "12.8"}.items():
            parsed = parse_version(component, version)
            NodeComponent.objects.create(node=node, component=component, version=version, version_key=parsed.key,
                                         branch=parsed.branch)
        return agent

    def facts(self, name: str) -> dict[str, str]:
        return self.agents[name].client.get("/v1/facts")["components"]

    def in_maintenance(self, name: str) -> bool:
        return bool(self.agents[name].client.get("/v1/health")["maintenance"])

    def operations(self, name: str) -> list[str]:
        folder = self.agents[name].state / "operations"
        return sorted(json.loads(p.read_text())["kind"] for p in folder.glob("*.json"))

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()


@pytest.fixture
def nodes(tmp_path: Path, settings: Any) -> Iterator[Nodes]:
    found = Nodes(tmp_path, settings)
    try:
        yield found
    finally:
        found.stop()


def _events(sweep: NodeSweep, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in EvidenceEvent.objects.filter(sweep=sweep, kind=kind).order_by("node_seq")]


def test_a_canary_failing_its_health_gate_halts_the_campaign_with_no_other_node_drained(nodes, people):
    for index in range(4):
        nodes.add(f"gpu{index:02d}")
    requester, approver = people
    campaign = approved_campaign(requester, approver, canary="1", soak_s=0, parallelism_per_cluster="2",
                                 error_budget="1", dcgm_level=1, site_checks=["site"])
    [canary_id] = campaign.approved_plan.content["canary"]["nodes"]
    canary = Node.objects.get(pk=canary_id).name
    nodes.fail(canary, ECC)
    services.start(campaign.pk, requester)
    campaign = drive(campaign.pk)

    assert campaign.status == CampaignStatus.HALTED and "the canary failed" in campaign.status_reason
    sweep = NodeSweep.objects.get(campaign=campaign, node_id=canary_id)
    assert sweep.state == SweepState.FAILED and "health gate failed: site:site" in sweep.error
    others = [n for n in nodes.agents if n != canary]
    assert set(NodeSweep.objects.filter(campaign=campaign).exclude(pk=sweep.pk).values_list("state", flat=True)) == {
        SweepState.PENDING}
    for name in others:
        assert nodes.operations(name) == [], f"{name} was touched"
        assert not nodes.in_maintenance(name) and nodes.facts(name)["driver"] == OLD
    # The failing check's output is in the evidence, beside the checks that passed or could not run.
    [gate] = _events(sweep, EvidenceKind.HEALTH_CHECKED)
    checks = {c["name"]: c for c in gate["checks"]}
    assert gate["passed"] is False and gate["failed"] == ["site:site"]
    assert ECC in checks["site:site"]["output"] and checks["site:site"]["detail"]["exit_code"] == 1
    assert checks["versions"]["status"] == "passed" and checks["dcgm"]["status"] == "skipped"
    # Reverted to what the agent recorded before the patch, verified after a reboot; kept out of service.
    [reverted] = _events(sweep, EvidenceKind.REVERTED)
    assert reverted["components"] == {"driver": OLD}
    assert reverted["reinstalled"] == {"nvidia-driver-570": f"{OLD}-1", "nvidia-utils-570": f"{OLD}-1"}
    assert _events(sweep, EvidenceKind.REVERT_VERIFIED)[0]["versions"] == {"driver": OLD}
    assert nodes.facts(canary)["driver"] == OLD
    assert nodes.in_maintenance(canary), "a node that failed its health gate stays out of service"
    assert Node.objects.get(pk=canary_id).service_state != ServiceState.IN_SERVICE
    assert _events(sweep, EvidenceKind.FAILED)[0]["left"] == "out of service on its previous versions"
    call_command("verify_evidence", campaign=campaign.pk)  # the new events are in the signed chains


def test_a_failing_patch_is_rolled_back_and_the_node_reports_its_previous_versions(nodes, people):
    patch = nodes.root / "site-patch"
    db = nodes.db("gpu00")
    # A real script that upgrades the driver package, then fails as a broken postinst would.
    patch.write_text(f"#!/bin/sh\n{sys.executable} -m gpusweep_agent.packages --db {db} install "
                     "nvidia-driver-570=$2-1\necho 'dpkg: error processing package nvidia-utils-570 (--configure)'\n"
                     "exit 1\n")
    patch.chmod(0o755)
    facts = {k: v for k, v in agents.FACTS.items() if k != "components"}
    # The driver's version comes from the package database (the agent's packages probe), as on a real node.
    nodes.add("gpu00", probes="packages", patch_methods=json.dumps({"script": {"path": str(patch)}}))
    nodes.agents["gpu00"].facts_file.write_text(json.dumps({**facts, "components": {"cuda": "12.8"}}))
    nodes.cluster.connection = {**nodes.cluster.connection, "executor_options": {
        "operation_timeout": 60, "patch_method": "script"}}
    nodes.cluster.save()
    requester, approver = people
    campaign = approved_campaign(requester, approver, after_rollback=AfterRollback.RETURN, error_budget="0")
    services.start(campaign.pk, requester)
    campaign = drive(campaign.pk)

    sweep = NodeSweep.objects.get(campaign=campaign)
    assert sweep.state == SweepState.FAILED and "error processing package" in sweep.error
    assert json.loads(db.read_text())["installed"]["nvidia-driver-570"] == f"{OLD}-1"
    installs = [i["packages"] for i in json.loads(db.read_text())["installs"]]
    assert installs == [{"nvidia-driver-570": f"{FIXED}-1"},
                        {"nvidia-driver-570": f"{OLD}-1", "nvidia-utils-570": f"{OLD}-1"}], "reinstalled once"
    assert nodes.facts("gpu00")["driver"] == OLD
    assert _events(sweep, EvidenceKind.REVERT_VERIFIED)[0]["versions"] == {"driver": OLD}
    # after_rollback "return": its gates passed on the old versions, so it is back in service.
    [gate] = _events(sweep, EvidenceKind.HEALTH_CHECKED)
    assert gate["passed"] and gate["expected"] == {"driver": OLD}
    assert not nodes.in_maintenance("gpu00")
    assert Node.objects.get(name="gpu00").service_state == ServiceState.IN_SERVICE
    assert Node.objects.get(name="gpu00").component_versions()["driver"] == OLD
    assert campaign.status == CampaignStatus.HALTED and "exceed the error budget" in campaign.status_reason


def test_a_halted_campaign_rolls_its_completed_nodes_back_through_a_new_approved_campaign(people):
    fleet, _cluster = make_fleet(nodes=3, spares=0, workloads=0)
    requester, approver = people
    campaign = approved_campaign(requester, approver, parallelism_per_cluster="1", error_budget="0")
    last, _ = max(campaign.approved_plan.content["nodes"].items(), key=lambda i: (i[1]["wave"], i[1]["position"]))
    failing = Node.objects.get(pk=int(last)).name
    fleet.fail_check(f"local/{failing}", "site:ecc", ECC)
    services.start(campaign.pk, requester)
    campaign = drive(campaign.pk)
    assert campaign.status == CampaignStatus.HALTED
    done = sorted(NodeSweep.objects.filter(campaign=campaign, state=SweepState.DONE).values_list("node__name",
                                                                                                flat=True))
    assert len(done) == 2 and failing not in done

    operator = APIClient()
    operator.force_authenticate(requester)
    answer = operator.post(f"/api/v1/campaigns/campaigns/{campaign.pk}/rollback-completed/")
    assert answer.status_code == 201, answer.content
    [created] = answer.json()
    assert created["status"] == CampaignStatus.DRAFT and created["rollback_of"] == campaign.pk
    assert created["target_versions"] == {"driver": OLD} and sorted(created["node_selector"]["names"]) == done
    again = operator.post(f"/api/v1/campaigns/campaigns/{campaign.pk}/rollback-completed/")
    assert [c["id"] for c in again.json()] == [created["id"]], "asking again creates nothing new"
    assert EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.ROLLBACK_CAMPAIGN).count() == 1

    # Planned and approved like any other: the plan takes the two nodes down to their previous driver.
    plan = services.make_plan(created["id"], requester)
    assert sorted(Node.objects.get(pk=int(i)).name for i in plan.content["nodes"]) == done
    assert {n["target"]["driver"] for n in plan.content["nodes"].values()} == {OLD}
    services.approve(created["id"], approver)
    services.start(created["id"], requester)
    rolled = drive(created["id"])
    assert rolled.status == CampaignStatus.COMPLETED
    for name in done:
        assert fleet.snapshot()["nodes"][f"local/{name}"]["versions"]["driver"] == OLD
        assert Node.objects.get(name=name).component_versions()["driver"] == OLD
    running = approved_campaign(requester, approver)
    refused = operator.post(f"/api/v1/campaigns/campaigns/{running.pk}/rollback-completed/")
    assert refused.status_code == 409 and "halted or aborted" in refused.json()["detail"]


@pytest.mark.parametrize(("fields", "bad"), [
    ({"dcgm_level": 7}, "dcgm_level"), ({"site_checks": ["nhc; rm"]}, "site_checks"),
    ({"site_checks": "nhc"}, "site_checks"), ({"after_rollback": "maybe"}, "after_rollback")])
def test_health_gate_and_rollback_settings_are_validated(people, fields, bad):
    requester, _ = people
    operator = APIClient()
    operator.force_authenticate(requester)
    answer = operator.post("/api/v1/campaigns/campaigns/", {"name": "gates", **fields}, format="json")
    assert answer.status_code == 400 and bad in answer.json()["errors"], answer.content
    assert not Campaign.objects.exists()


def test_the_console_offers_roll_back_completed_nodes_on_a_halted_campaign(people, client):
    requester, approver = people
    make_fleet(nodes=1, spares=0, workloads=0)
    campaign = approved_campaign(requester, approver)
    client.force_login(requester)
    assert b"rollback-completed" not in client.get(f"/campaigns/{campaign.pk}/").content
    NodeSweep.objects.create(campaign=campaign, node=Node.objects.get(), wave=1, target={"driver": FIXED},
                             state=SweepState.DONE, versions_before={"driver": OLD})
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.HALTED)
    assert b"Roll back completed nodes" in client.get(f"/campaigns/{campaign.pk}/").content
    answer = client.post(f"/campaigns/{campaign.pk}/rollback_completed/")
    created = Campaign.objects.get(rollback_of=campaign)
    assert answer.status_code == 302 and answer["Location"].endswith(f"/campaigns/{created.pk}/")
    assert created.target_versions == {"driver": OLD}


def test_the_console_form_sets_the_health_gates_and_the_rollback_policy(people, client):
    requester, _ = people
    make_fleet(nodes=1, spares=0, workloads=0)
    client.force_login(requester)
    answer = client.post("/campaigns/new/", {"name": "gated", "parallelism_per_cluster": "1", "error_budget": "1",
                                             "workload_policy": "checkpoint", "approvals_required": "1",
                                             "dcgm_level": "3", "site_check_names": "nhc, ib",
                                             "after_rollback": "return"})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    campaign = Campaign.objects.get(name="gated")
    assert (campaign.dcgm_level, campaign.site_checks, campaign.after_rollback) == (3, ["nhc", "ib"], "return")
    refused = client.post("/campaigns/new/", {"name": "bad", "parallelism_per_cluster": "1", "error_budget": "1",
                                              "workload_policy": "checkpoint", "approvals_required": "1",
                                              "site_check_names": "nhc;reboot"})
    assert refused.status_code == 200 and "site check names" in refused.content.decode()
    assert not Campaign.objects.filter(name="bad").exists()


def test_a_gate_failing_once_brings_the_node_back_with_its_parked_counters_resumed_with_no_gap(nodes, people,
                                                                                                  tmp_path):
    """Issue 25, done-when 2: placement "home", a site check failing once, after_rollback "return": the
    node is reverted and returns, and every counter parked for it resumes there from where it stopped."""
    agent = nodes.add("gpu00")
    node = Node.objects.get(name="gpu00")
    counters = {}
    for index in range(3):
        ref = f"wl-counter{index}"
        counters[ref] = tmp_path / f"counter{index}.log"
        agents.start_workload(agent, ref, counters[ref], megabytes=1, engine="signal")
        Workload.objects.create(cluster=nodes.cluster, node=node, kind="process", scheduler_id=ref, name=ref, gpus=1,
                                checkpoint_engine="signal")
    for log in counters.values():
        agents.wait_steps(log, 3)
    nodes.fail("gpu00", ECC, once=True)
    requester, approver = people
    campaign = approved_campaign(requester, approver, soak_s=0, workload_placement="home",
                                 after_rollback=AfterRollback.RETURN, site_checks=["site"], error_budget="1")
    assert {m["action"] for m in campaign.approved_plan.content["nodes"][str(node.pk)]["moves"]} == {"return_home"}
    services.start(campaign.pk, requester)
    try:
        campaign = drive(campaign.pk)
        sweep = NodeSweep.objects.get(campaign=campaign, node=node)
        assert sweep.state == SweepState.FAILED and "health gate failed" in sweep.error
        node.refresh_from_db()
        assert node.service_state == ServiceState.IN_SERVICE and not nodes.in_maintenance("gpu00")
        assert nodes.facts("gpu00")["driver"] == OLD
        [last] = _events(sweep, "failed")
        assert last["left"] == "in service on its previous versions"
        assert {w["to"] for w in last["workloads_restored"]} == {"gpu00"}
        for log in counters.values():
            before = len(agents.steps(log))
            after = agents.wait_steps(log, before + 3)
            assert agents.unbroken(after) == len(after), f"{log.name}: a gap or a restart"
    finally:
        for workload in agent.client.get("/v1/workloads").get("workloads", []):
            if workload.get("pid"):
                agents.kill_pid(int(workload["pid"]))
