"""The one rule by which a back end treats a pod or job that declared no GPUs but holds some
(executors.base.as_gpu_workload), on GPU users as the agent reports them (gpu_users_from)."""

from __future__ import annotations

from executors.base import UNDECLARED, WorkloadInfo, as_gpu_workload, gpu_users_from, held_gpus

UID = "7c1e2f0a-5b6d-4c3e-9f8a-1b2c3d4e5f60"
ANSWER = {"gpu_users": [
    # a pod's process, by its cgroup: two GPUs and the control device (not a GPU)
    {"pid": 10, "name": "python3", "devices": ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"],
     "owner": {"kind": "k8s_pod", "pod_uid": UID, "cgroup": f"/kubepods/pod{UID}/x"}},
    # the same pod's second process on one of those GPUs
    {"pid": 11, "name": "worker", "devices": ["/dev/nvidia1"], "owner": {"kind": "k8s_pod", "pod_uid": UID}},
    # a job's payload found by its gpusweep-run registration (no Slurm cgroup)
    {"pid": 20, "name": "train", "devices": ["/dev/nvidia2"], "workload_id": "slurm-42",
     "owner": {"kind": "process", "cgroup": "/"}},
    # a node daemon inside the job's cgroup holds GPUs by design: never the job's
    {"pid": 30, "name": "nv-hostengine", "devices": ["/dev/nvidia3"], "system": True,
     "owner": {"kind": "slurm_job", "job_id": "43"}},
]}


def test_a_workload_that_declared_no_gpus_holds_those_the_agent_sees_it_hold() -> None:
    users = gpu_users_from(ANSWER)
    assert held_gpus(users, "k8s_pod", UID) == 2
    assert held_gpus(users, "slurm_job", "42", "slurm-42") == 1
    assert held_gpus(users, "slurm_job", "43", "slurm-43") == 0
    pod = as_gpu_workload(WorkloadInfo(id="ml/sneaky", name="sneaky"), users, "k8s_pod", UID)
    assert pod is not None and (pod.gpus, pod.origin) == (2, UNDECLARED)
    # Declared: unchanged, whatever the agent sees; neither declared nor held: no GPU workload.
    declared = WorkloadInfo(id="ml/trainer", name="trainer", gpus=4)
    assert as_gpu_workload(declared, users, "k8s_pod", UID) is declared
    assert as_gpu_workload(WorkloadInfo(id="ml/web"), users, "k8s_pod", "another-uid") is None
