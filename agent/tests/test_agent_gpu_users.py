"""GPU users beyond the scheduler's view: the cgroup parsers on recorded paths, and the /proc scan
with a real process holding a descriptor on a stand-in device file (no /dev/nvidia* here: the
agent is configured to treat the stand-in's path as a GPU device)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_helpers import AgentProcess, wait_for
from gpusweep_agent.workloads import cgroup_path, device_holders, owner_of_cgroup, registration_owner

CONTAINER = "4f1c2b3a" * 8
RECORDED = [
    # kubelet with the systemd cgroup driver, cgroup v2 (containerd)
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c1e2f0a_5b6d_4c3e_9f8a_1b2c3d4e5f60.slice/"
     f"cri-containerd-{CONTAINER}.scope\n",
     {"kind": "k8s_pod", "pod_uid": "7c1e2f0a-5b6d-4c3e-9f8a-1b2c3d4e5f60", "container_id": CONTAINER}),
    # kubelet with the cgroupfs driver, cgroup v1 (a DaemonSet pod: no nvidia.com/gpu request)
    ("12:devices:/kubepods/besteffort/pod0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/" + CONTAINER + "\n"
     "11:memory:/kubepods/besteffort/pod0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d/" + CONTAINER + "\n",
     {"kind": "k8s_pod", "pod_uid": "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "container_id": CONTAINER}),
    # slurmstepd, cgroup v2
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
     {"kind": "slurm_job", "job_id": "4242", "step": "0"}),
    # slurmstepd, cgroup v1 (a batch step)
    ("7:devices:/slurm/uid_1000/job_77/step_batch\n4:cpuset:/slurm/uid_1000/job_77/step_batch\n",
     {"kind": "slurm_job", "job_id": "77", "step": "batch"}),
    # a login session's process: no scheduler knows it
    ("0::/user.slice/user-1000.slice/session-3.scope\n", {"kind": "process"}),
]


@pytest.mark.parametrize(("text", "owner"), RECORDED)
def test_it_maps_a_process_to_its_pod_job_or_nothing_by_its_cgroup_path(text: str, owner: dict[str, str]) -> None:
    found = owner_of_cgroup(cgroup_path(text))
    assert {k: v for k, v in found.items() if k != "cgroup"} == owner
    assert found["cgroup"].startswith("/")


@pytest.mark.parametrize(("text", "owner"), RECORDED)
def test_a_registration_names_the_job_or_pod_it_runs_in(tmp_path: Path, text: str, owner: dict[str, str]) -> None:
    """What the heartbeat's `owner` says of a gpusweep-run registration (the service joins it to that job's
    row): by its process's cgroup (a recorded one, in a /proc-shaped folder), or by SLURM_JOB_ID."""
    (tmp_path / "4321").mkdir()
    (tmp_path / "4321" / "cgroup").write_text(text)
    found = registration_owner({"id": "wl-1", "pid": 4321, "env": {}}, tmp_path)
    wanted = {"slurm_job": {"kind": "slurm_job", "id": owner.get("job_id", "")},
              "k8s_pod": {"kind": "k8s_pod", "id": owner.get("pod_uid", "")}}.get(owner["kind"], {})
    assert found == wanted
    # Inside a job, its environment says so even when its process is gone (checkpointed, restored elsewhere).
    assert registration_owner({"id": "slurm-9", "pid": 999999, "env": {"SLURM_JOB_ID": "9"}}, tmp_path) == {
        "kind": "slurm_job", "id": "9"}


def test_it_finds_a_real_process_holding_a_stand_in_gpu_device(tmp_path: Path) -> None:
    device = tmp_path / "dev" / "nvidia0"
    device.parent.mkdir()
    device.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(device)!r}); import time; time.sleep(60)"])
    try:
        pattern = str(tmp_path / "dev" / "nvidia[0-9]*")
        wait_for(lambda: holder.pid in device_holders([pattern]), 10, what="the holder to open the device")
        assert device_holders([pattern])[holder.pid] == [str(device)]
        agent = AgentProcess(tmp_path, "u1", tmp_path / "artifacts", gpu_devices=pattern).start()
        try:
            users = agent.client.get("/v1/gpu-users")["gpu_users"]
            [user] = [u for u in users if u["pid"] == holder.pid]
            assert user["devices"] == [str(device)] and user["name"] == Path(sys.executable).name[:15]
            assert user["owner"]["kind"] in ("process", "k8s_pod", "slurm_job") and user["workload_id"] == ""
            # Unregistered, so it is a workload the campaign's policy applies to (checkpoint, stop or wait).
            listed = agent.client.get("/v1/workloads")["workloads"]
            if user["owner"]["kind"] == "process":
                entry = next(w for w in listed if w["pid"] == holder.pid)
                assert (entry["id"], entry["kind"], entry["gpus"]) == (f"gpu-pid-{holder.pid}", "gpu_process", 1)
        finally:
            agent.stop()
        # A node daemon that holds GPUs by design (nvidia-persistenced, nv-hostengine) is listed, never moved.
        daemon = AgentProcess(tmp_path, "u2", tmp_path / "artifacts", gpu_devices=pattern,
                              gpu_system_processes=user["name"]).start()
        try:
            [seen] = [u for u in daemon.client.get("/v1/gpu-users")["gpu_users"] if u["pid"] == holder.pid]
            assert seen["system"] is True
            assert holder.pid not in [w.get("pid") for w in daemon.client.get("/v1/workloads")["workloads"]]
        finally:
            daemon.stop()
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert holder.pid not in device_holders([pattern])
