"""Campaigns from distribution advisories over real node agents (issue 30, done-when 4 and 2). Done-when 4:
one campaign, both kinds of node. Through the local executor and two real agent processes (agent/), each running a
counter workload under gpusweep-run with the signal engine: the node whose running kernel Livepatch
notice LSN-0066-1 covers gets the agent's livepatch method and nothing else (never in maintenance, its
counter never checkpointed and never stopped); the node below the notice's base kernel is drained, its
counter checkpointed and parked, the fixed kernel installed and booted, and the counter restored there.
The agents' livepatch, package patch and reboot are their simulated ones (no kernel can be installed
or booted on this machine, and canonical-livepatch is a snap service that cannot run here).
Done-when 2: the agents' package databases are the recording stand-in for dpkg (gpusweep_agent.packages:
no distribution package can be installed here), written by a real command from the `package` method's
exact-packages template. About 10 s each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from advisories.ingest import ingest_documents
from advisories.models import Advisory, Exposure
from advisories.sources import resolve
from campaigns.choices import CampaignStatus, EvidenceKind
from campaigns.models import EvidenceEvent, NodeSweep
from inventory.choices import ServiceState
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.packages import apply_os_report, parse_os_report
from inventory.versions import parse_version
from tests.advisories.test_osmatch import BIONIC, DRIVER_FIXED, DRIVER_OLD, bionic_kernel_usn, kernel_packages
from tests.advisories.test_osv_ingest import OSV
from tests.campaigns import test_os_packages_campaign as packaged
from tests.campaigns.fleet import approved_campaign, drive, user
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "agent" / "tests"))
import agent_helpers as agents

pytestmark = pytest.mark.django_db
COVERED, TOO_OLD, FIXED_KERNEL = "4.15.0-70-generic", "4.15.0-60-generic", "4.15.0-99-generic"


def _node(root: Path, cluster: Cluster, name: str, kernel: str) -> tuple[agents.AgentProcess, Node, Path]:
    """A real agent on a bionic node running `kernel`, its inventory node (with what its agent's OS report
    says), and a counter workload started through gpusweep-run."""
    facts = {**agents.FACTS, "components": {**agents.FACTS["components"], "kernel": kernel}}
    agent = agents.AgentProcess(
        root,
        name,
        root / "artifacts",
        facts=facts,
        reboot_command="simulate",
        patch_methods=json.dumps({"package": {"simulate": True}, "livepatch": {"simulate": True}}),
        health_options=json.dumps({"gpus": {"libnvidia_ml": ""}}),
        **agents.NO_SCHEDULER,
    ).start()
    node = Node.objects.create(
        cluster=cluster,
        name=name,
        gpu_model=facts["gpu_model"],
        gpu_count=8,
        agent_endpoint=f"http://127.0.0.1:{agent.port}",
        labels={"sweep": "yes"},
    )
    for component, version in facts["components"].items():
        parsed = parse_version(component, version)
        NodeComponent.objects.create(
            node=node, component=component, version=version, version_key=parsed.key, branch=parsed.branch
        )
    abi = kernel.rsplit("-", 1)[0]
    apply_os_report(
        node.pk,
        parse_os_report(
            {
                "os": {
                    "release": BIONIC,
                    "running_kernel": kernel,
                    "packages": kernel_packages(abi, f"{abi}.79", "generic", "linux"),
                    "livepatch": {
                        "tool": "canonical-livepatch",
                        "state": "nothing-to-apply",
                        "version": "65",
                        "fixes": [],
                    },
                }
            }
        ),
    )
    log = root / f"counter-{name}.log"
    agents.start_workload(agent, f"wl-{name}", log, megabytes=1, engine="signal")
    Workload.objects.create(
        cluster=cluster,
        node=node,
        kind="process",
        scheduler_id=f"wl-{name}",
        name=f"wl-{name}",
        gpus=1,
        checkpoint_engine="signal",
    )
    return agent, node, log


def test_one_usn_campaign_livepatches_one_node_in_place_and_reboots_the_other_with_its_counter_parked(
    tmp_path: Path, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.GPUSWEEP_AGENT_FLEET_SECRET = agents.FLEET_SECRET
    cluster = Cluster.objects.create(
        name=agents.CLUSTER,
        kind="static",
        connection={"executor": "local", "executor_options": {"operation_timeout": 60}},
    )
    started: list[agents.AgentProcess] = []
    try:
        live_agent, covered, live_log = _node(tmp_path, cluster, "covered", COVERED)
        started.append(live_agent)
        boot_agent, too_old, boot_log = _node(tmp_path, cluster, "too-old", TOO_OLD)
        started.append(boot_agent)
        ingest_documents(resolve(str(bionic_kernel_usn(tmp_path))).items())
        ingest_documents(resolve(str(OSV / "LSN-0066-1.json")).items())
        for log in (live_log, boot_log):
            agents.wait_steps(log, 3)
        requester, approver = user("rita", "operator"), user("alan", "approver")
        campaign = approved_campaign(
            requester, approver, target_versions={}, workload_placement="home", dcgm_level=0, soak_s=0
        )
        campaign.advisories.set(Exposure.objects.values_list("advisory_id", flat=True).distinct())
        from campaigns import services

        services.make_plan(campaign.pk, requester)
        services.approve(campaign.pk, approver)
        plan = services.Campaign.objects.get(pk=campaign.pk).approved_plan.content["nodes"]
        assert plan[str(covered.pk)]["target"] == {"livepatch": "66"}
        assert plan[str(too_old.pk)]["target"] == {"kernel": FIXED_KERNEL}
        assert [m["action"] for m in plan[str(too_old.pk)]["moves"]] == ["return_home"]
        with django_capture_on_commit_callbacks(execute=True):
            services.start(campaign.pk, requester)
            done = drive(campaign.pk)
        errors = list(NodeSweep.objects.filter(campaign=campaign).values_list("node__name", "state", "error"))
        assert done.status == CampaignStatus.COMPLETED, errors

        live_ops = sorted(json.loads(p.read_text())["kind"] for p in (live_agent.state / "operations").glob("*.json"))
        # Its counter's own registration (gpusweep-run), and the campaign's livepatch: nothing else.
        assert live_ops == ["patch", "register"], "no maintenance, checkpoint or reboot on the livepatched node"
        assert live_agent.client.get("/v1/facts")["components"]["livepatch"] == "66"
        boot_ops = {json.loads(p.read_text())["kind"] for p in (boot_agent.state / "operations").glob("*.json")}
        assert {"maintenance", "checkpoint", "patch", "reboot", "restore"} <= boot_ops
        assert boot_agent.client.get("/v1/facts")["components"]["kernel"] == FIXED_KERNEL
        [parked] = EvidenceEvent.objects.filter(sweep__node=too_old, kind=EvidenceKind.PARKED).values_list(
            "data", flat=True
        )
        assert parked["checkpoint_id"] and parked["restore"] == "on this node after its reboot"
        # Both counters count on without a gap or a restart: one never stopped, one parked and resumed.
        for log in (live_log, boot_log):
            after = agents.wait_steps(log, len(agents.steps(log)) + 3)
            assert agents.unbroken(after) == len(after), f"{log.name}: a gap or a restart"
        for node in (covered, too_old):
            node.refresh_from_db()
            sweep = NodeSweep.objects.get(campaign=campaign, node=node)
            exposure = Exposure.objects.get(node=node)
            credited = f"campaign {campaign.pk}, sweep {sweep.pk}"
            assert (exposure.state, exposure.remediated_by) == ("remediated", credited)
            assert node.service_state == ServiceState.IN_SERVICE
        assert too_old.running_kernel == FIXED_KERNEL and covered.livepatch["version"] == "66"
    finally:
        for agent in started:
            for workload in agent.client.get("/v1/workloads").get("workloads", []):
                if workload.get("pid"):
                    agents.kill_pid(int(workload["pid"]))
            agent.stop()


def _packaged_node(root: Path, cluster: Cluster, name: str, packages: list[list[str]],
                   components: dict[str, str]) -> tuple[agents.AgentProcess, Node, Path, Path]:
    """A real agent on a jammy node whose packages are its recording package database (the stand-in
    for dpkg: the driver's version is read from it, as from dpkg-query), its `package` patch method's
    exact-packages template a real command that installs into that database, and a counter workload."""
    db = root / f"packages-{name}.json"
    db.write_text(json.dumps({"installed": {row[0]: row[1] for row in packages}}))
    install = f"{sys.executable} -m gpusweep_agent.packages --db {db} install {{packages}}"
    facts = {**agents.FACTS, "components": {"cuda": "12.8"}}  # the driver comes from the package database
    agent = agents.AgentProcess(
        root, name, root / "artifacts", facts=facts, reboot_command="simulate", probes="packages",
        package_manager="recording", package_db=str(db),
        patch_methods=json.dumps({"package": {"commands": {"packages": install}}}),
        health_options=json.dumps({"gpus": {"libnvidia_ml": ""}}), **agents.NO_SCHEDULER,
    ).start()
    node = Node.objects.create(cluster=cluster, name=name, gpu_model=facts["gpu_model"], gpu_count=8,
                               agent_endpoint=f"http://127.0.0.1:{agent.port}", labels={"sweep": "yes"})
    for component, version in {"cuda": "12.8", **components}.items():
        parsed = parse_version(component, version)
        NodeComponent.objects.create(node=node, component=component, version=version, version_key=parsed.key,
                                     branch=parsed.branch)
    packaged.report(node, packages)
    log = root / f"counter-{name}.log"
    agents.start_workload(agent, f"wl-{name}", log, megabytes=1, engine="signal")
    Workload.objects.create(cluster=cluster, node=node, kind="process", scheduler_id=f"wl-{name}", name=f"wl-{name}",
                            gpus=1, checkpoint_engine="signal")
    return agent, node, log, db


def test_a_usn_campaign_installs_the_exact_driver_packages_and_updates_a_library_in_place_on_real_agents(
    tmp_path: Path, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """Done-when 2 over real agents: the packaged driver's node is drained, its counter parked, every
    binary of nvidia-graphics-drivers-515-server installed at USN-5547-1's jammy version by the agent's
    template (a real command), the node rebooted and its driver read back; the openssl node gets its
    update in place, its counter never stopped. Both remediated, credited to the campaign."""
    settings.GPUSWEEP_AGENT_FLEET_SECRET = agents.FLEET_SECRET
    cluster = Cluster.objects.create(name=agents.CLUSTER, kind="static",
                                     connection={"executor": "local", "executor_options": {"operation_timeout": 60}})
    started: list[agents.AgentProcess] = []
    try:
        with django_capture_on_commit_callbacks(execute=True):
            driver_agent, driver_node, driver_log, driver_db = _packaged_node(
                tmp_path, cluster, "packaged", packaged.driver_set(DRIVER_OLD), {"driver": "515.48.07"})
            started.append(driver_agent)
            lib_agent, lib_node, lib_log, lib_db = _packaged_node(
                tmp_path, cluster, "library", packaged.ssl_set(packaged.SSL_OLD), {"driver": "515.65.01"})
            started.append(lib_agent)
            for path in (OSV / "nvidia-5383.json", OSV / "USN-5547-1.json", packaged.openssl_usn(tmp_path)):
                ingest_documents(resolve(str(path)).items())
        assert driver_agent.client.get("/v1/facts")["components"]["driver"] == "515.48.07"
        for log in (driver_log, lib_log):
            agents.wait_steps(log, 3)
        requester, approver = user("rita", "operator"), user("alan", "approver")
        campaign = approved_campaign(requester, approver, target_versions={}, workload_placement="home",
                                     dcgm_level=0, soak_s=0)
        campaign.advisories.set(Advisory.objects.all())
        from campaigns import services

        services.make_plan(campaign.pk, requester)
        services.approve(campaign.pk, approver)
        plan = services.Campaign.objects.get(pk=campaign.pk).approved_plan.content["nodes"]
        assert plan[str(driver_node.pk)]["target"] == {"driver": "515.65.01"}
        assert plan[str(lib_node.pk)]["in_place"] and set(plan[str(lib_node.pk)]["target"]) == {"packages"}
        with django_capture_on_commit_callbacks(execute=True):
            services.start(campaign.pk, requester)
            done = drive(campaign.pk)
        errors = list(NodeSweep.objects.filter(campaign=campaign).values_list("node__name", "state", "error"))
        assert done.status == CampaignStatus.COMPLETED, errors

        # Exactly the USN's versions of the binaries the node had, in one install each, by the template's command.
        assert [i["packages"] for i in json.loads(driver_db.read_text())["installs"]] == [
            {name: DRIVER_FIXED for name in packaged.BINARIES}]
        assert [i["packages"] for i in json.loads(lib_db.read_text())["installs"]] == [
            {"libssl3": packaged.SSL_FIXED, "openssl": packaged.SSL_FIXED}]
        assert driver_agent.client.get("/v1/facts")["components"]["driver"] == "515.65.01"
        driver_ops = {json.loads(p.read_text())["kind"] for p in (driver_agent.state / "operations").glob("*.json")}
        assert {"maintenance", "checkpoint", "patch", "reboot", "restore"} <= driver_ops
        lib_ops = sorted(json.loads(p.read_text())["kind"] for p in (lib_agent.state / "operations").glob("*.json"))
        assert lib_ops == ["patch", "register"], "no maintenance, checkpoint or reboot for a package update in place"
        for log in (driver_log, lib_log):
            after = agents.wait_steps(log, len(agents.steps(log)) + 3)
            assert agents.unbroken(after) == len(after), f"{log.name}: a gap or a restart"

        for node, advisories in ((driver_node, {"5383", "USN-5547-1"}), (lib_node, {"USN-9998-1"})):
            sweep = NodeSweep.objects.get(campaign=campaign, node=node)
            credited = f"campaign {campaign.pk}, sweep {sweep.pk}"
            assert {(e.advisory.publisher_id, e.state, e.remediated_by)
                    for e in Exposure.objects.filter(node=node).select_related("advisory")} == {
                (a, "remediated", credited) for a in advisories}
        # The agents' next OS reports (their package databases now) change nothing: the credit stays.
        with django_capture_on_commit_callbacks(execute=True):
            for node, db in ((driver_node, driver_db), (lib_node, lib_db)):
                installed = json.loads(db.read_text())["installed"]
                sources = {"bash": "bash", "libssl3": "openssl", "openssl": "openssl"}
                rows = [[n, v, "amd64", sources.get(n, packaged.SOURCE), v] for n, v in installed.items()]
                packaged.report(node, rows)
        assert not Exposure.objects.exclude(remediated_by__startswith=f"campaign {campaign.pk}, sweep").exists()
    finally:
        for agent in started:
            for workload in agent.client.get("/v1/workloads").get("workloads", []):
                if workload.get("pid"):
                    agents.kill_pid(int(workload["pid"]))
            agent.stop()
