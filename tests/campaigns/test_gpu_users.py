"""GPU users beyond the scheduler's view (issue 19, item 6): the plan lists every process holding a
GPU that no scheduler reported as a GPU workload, with what the workload policy does with it.

On the memory executor (a test double standing in for the node agents' /v1/gpu-users answers), and
through a real agent whose /proc scan finds a real process holding a stand-in device file (no
/dev/nvidia* here: the agent is configured to treat that path as a GPU device)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from campaigns import services
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.models import EvidenceEvent, NodeSweep
from inventory.models import Cluster, Node, NodeComponent, Workload
from inventory.versions import parse_version
from tests.campaigns.fleet import OLD, approved_campaign, drive, make_fleet, user
from tests.helpers import REPO, cgroups_writable, in_cgroup

sys.path.insert(0, str(REPO / "agent" / "tests"))
import agent_helpers as agents

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver")


def test_the_plan_shows_gpu_users_the_scheduler_did_not_report_with_their_policy(people, client):
    fleet, cluster = make_fleet(nodes=2, spares=0, workloads=0)
    gpu00 = Node.objects.get(name="gpu00")
    Workload.objects.create(cluster=cluster, node=gpu00, kind="slurm_job", scheduler_id="77", gpus=0, name="prep")
    Workload.objects.create(cluster=cluster, node=gpu00, kind="slurm_job", scheduler_id="78", gpus=4, name="train")
    fleet.add_gpu_user("local/gpu00", 4242, "python3")  # started by hand: no scheduler knows it
    fleet.add_gpu_user("local/gpu00", 5151, "prep.sh", "slurm_job", "77")  # a job that declared no GPUs
    fleet.add_gpu_user("local/gpu00", 6161, "train", "slurm_job", "78")  # declared: the scheduler's
    fleet.add_gpu_user("local/gpu01", 7171, "dcgm-exporter", "k8s_pod", "gpu-operator/dcgm-exporter-x")
    requester, approver = people
    campaign = approved_campaign(requester, approver, workload_overrides={"python3": "wait"})
    plan = campaign.approved_plan.content
    by_node = {entry["name"]: {u["pid"]: u for u in entry["users"]} for entry in plan["unreported_gpu_users"]}
    assert sorted(by_node["gpu00"]) == [4242, 5151] and sorted(by_node["gpu01"]) == [7171]
    assert by_node["gpu00"][4242]["policy"] == "wait" and by_node["gpu00"][4242]["action"] == "wait for it to end"
    assert by_node["gpu00"][5151]["owner"] == {"kind": "slurm_job", "id": "77"}
    assert by_node["gpu00"][5151]["action"] == "checkpoint it"
    assert plan["summary"]["unreported_gpu_users"] == 3
    assert plan["nodes"][str(gpu00.pk)]["unreported_gpu_users"][0]["pid"] == 4242
    client.force_login(requester)
    page = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert "GPU users the scheduler did not report" in page and "pid 7171 dcgm-exporter" in page


def test_a_real_gpu_user_found_by_the_agent_is_planned_and_stopped_by_the_policy(people, tmp_path: Path,
                                                                                   settings: Any):
    """The node runs no scheduler (agents.NO_SCHEDULER): a pod of another test on this shared host (a process
    in a kubepods cgroup, as the Kubernetes tests make) is none of its workloads, and is left running."""
    settings.GPUSWEEP_AGENT_FLEET_SECRET = agents.FLEET_SECRET
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(device)!r}); import time; time.sleep(120)"])
    bystander = subprocess.Popen(["sleep", "120"])
    agent = None
    try:
        with contextlib.ExitStack() as stack:
            if cgroups_writable()[0]:
                stack.enter_context(in_cgroup(bystander.pid, f"/kubepods/besteffort/pod{uuid.uuid4()}/{'ab' * 32}"))
            stack.callback(_end, bystander)  # reaped before its cgroup is removed (a zombie keeps it)
            agents.wait_for(lambda: (Path(f"/proc/{holder.pid}/fd/3").exists()), 10, what="the holder's descriptor")
            agent = agents.AgentProcess(tmp_path, "gpu00", tmp_path / "artifacts", reboot_command="simulate",
                                        patch_methods='{"package": {"simulate": true}}',
                                        gpu_devices=str(tmp_path / "dev" / "nvidia[0-9]*"),
                                        **agents.NO_SCHEDULER).start()
            cluster = Cluster.objects.create(name=agents.CLUSTER, kind="static", connection={"executor": "local"})
            node = Node.objects.create(cluster=cluster, name="gpu00", gpu_model=agents.FACTS["gpu_model"],
                                       gpu_count=8, agent_endpoint=f"http://127.0.0.1:{agent.port}",
                                       labels={"sweep": "yes"})
            parsed = parse_version("driver", OLD)
            NodeComponent.objects.create(node=node, component="driver", version=OLD, version_key=parsed.key,
                                         branch=parsed.branch)
            requester, approver = people
            campaign = approved_campaign(requester, approver, workload_policy="cold_restart",
                                         cold_restart_allowed=True)
            [entry] = campaign.approved_plan.content["unreported_gpu_users"]
            [found] = [u for u in entry["users"] if u["pid"] == holder.pid]
            assert found["devices"] == [str(device)] and found["action"] == "stop it"
            services.start(campaign.pk, requester)
            campaign = drive(campaign.pk)
            assert campaign.status == CampaignStatus.COMPLETED
            assert NodeSweep.objects.get(campaign=campaign).state == SweepState.DONE
            stopped = EvidenceEvent.objects.get(campaign=campaign, kind=EvidenceKind.STOPPED).data
            assert stopped["workload"] in (Path(sys.executable).name[:15], f"gpu-pid-{holder.pid}")
            holder.wait(10)  # the policy stopped it before the patch
            assert bystander.poll() is None, "the campaign stopped a process of no workload of its node"
    finally:
        for proc in (holder, bystander):
            _end(proc)
        if agent is not None:
            agent.stop()


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Kill `proc` if it still runs, and reap it either way."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
