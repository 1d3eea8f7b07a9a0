"""Workloads on this node: the registry of wrapped processes, and discovery of the others.

Processes started through ``gpusweep-run`` are registered (persisted in
``<state>/workloads.json``). Slurm job steps and Kubernetes pods are discovered from the cgroup
of every process in /proc, and GPU processes through NVML when it is present.

GPU users (``gpu_users``): every process holding a GPU, whether or not a scheduler declared it:
NVML's compute processes, and every process with an open descriptor on a GPU device file
(``gpu_devices`` globs, ``/dev/nvidia*`` by default) under ``/proc/<pid>/fd``. Each is mapped to
its owner from its cgroup path: a Kubernetes pod (its UID and container), a Slurm job (and step),
or a bare process; a process registered through ``gpusweep-run`` (or a child of one) names its
workload.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .util import pid_alive, read_json, write_json_atomic

# A workload in one of these states occupies this node; a checkpointed, stopped or exited one
# does not (after a migration its record stays here, but the work runs elsewhere).
LIVE_STATES = frozenset({"running", "restored"})
WORKLOAD_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
# cgroup v1 and v2 layouts of slurmstepd: .../slurm/uid_0/job_42/step_0/... or .../job_42/step_batch/...
SLURM_RE = re.compile(r"/job_(\d+)/step_([A-Za-z0-9_.]+)")
# A host running several slurmd (Slurm built with multiple-slurmd, one host playing several nodes) names
# the node in its steps' cgroups: v1 /slurm_<node>/uid_0/job_42/..., v2 .../<node>_slurmstepd.scope/job_42/...
SLURM_NODE_RE = re.compile(r"/(?:slurm_([^/\n]+)/uid_\d+|([^/\n]+)_slurmstepd\.scope)/job_\d+/")
# kubelet's cgroups: kubepods.slice/kubepods-burstable-pod<uid with _>.slice or kubepods/besteffort/pod<uid>
K8S_RE = re.compile(r"kubepods.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")

# The container of a pod: cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope or a bare 64-hex id.
CONTAINER_RE = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?$")
SLURM_JOB_RE = re.compile(r"/job_(\d+)(?:/step_([A-Za-z0-9_.]+))?")

PUBLIC_FIELDS = ("id", "kind", "scheduler_id", "name", "gpus", "started_at", "checkpoint_engine", "engine",
                 "engine_version", "model_name", "model_version", "pid", "state", "output")


class WorkloadRegistry:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "workloads.json"
        self._lock = threading.Lock()

    def all(self) -> dict[str, dict[str, Any]]:
        data: dict[str, dict[str, Any]] = read_json(self.path, {}) or {}
        return data

    def get(self, workload_id: str) -> dict[str, Any] | None:
        return self.all().get(workload_id)

    def put(self, workload: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            data = self.all()
            data[workload["id"]] = workload
            write_json_atomic(self.path, data)
        return workload

    def update(self, workload_id: str, **fields: Any) -> dict[str, Any]:
        with self._lock:
            data = self.all()
            workload = {**data.get(workload_id, {"id": workload_id}), **fields}
            data[workload_id] = workload
            write_json_atomic(self.path, data)
        return workload

    def refreshed(self) -> list[dict[str, Any]]:
        """Registered workloads with their state brought up to date from /proc."""
        out = []
        for workload in self.all().values():
            if workload.get("state") in LIVE_STATES and not pid_alive(int(workload.get("pid") or 0)):
                workload = self.update(workload["id"], state="exited")
            out.append(workload)
        return out


def public(workload: dict[str, Any]) -> dict[str, Any]:
    base = {"kind": "process", "scheduler_id": workload.get("id", ""), "name": "", "gpus": 0, "started_at": "",
            "checkpoint_engine": "criu", "engine": "", "engine_version": "", "model_name": "", "model_version": ""}
    return {**base, **{k: workload[k] for k in PUBLIC_FIELDS if k in workload}}


def registration_owner(workload: dict[str, Any], proc_root: Path = Path("/proc")) -> dict[str, str]:
    """The scheduler's workload a gpusweep-run registration runs in, for the heartbeat's ``owner``:
    {"kind": "slurm_job", "id": <job id>} (its environment's SLURM_JOB_ID, which a requeue and a
    restore keep) or, by its process's cgroup, {"kind": "slurm_job" | "k8s_pod", "id": <job id | pod UID>};
    {} when it runs in neither. The service stores the registration on that workload's row."""
    job = str((workload.get("env") or {}).get("SLURM_JOB_ID") or "")
    if job.isdigit():
        return {"kind": "slurm_job", "id": job}
    try:
        text = (proc_root / str(int(workload.get("pid") or 0)) / "cgroup").read_text()
    except (OSError, ValueError):
        return {}
    owner = owner_of_cgroup(cgroup_path(text))
    if owner["kind"] == "slurm_job":
        return {"kind": "slurm_job", "id": owner["job_id"]}
    if owner["kind"] == "k8s_pod":
        return {"kind": "k8s_pod", "id": owner["pod_uid"]}
    return {}


def listed(workload: dict[str, Any], proc_root: Path = Path("/proc")) -> dict[str, Any]:
    """A registered workload as ``GET /v1/workloads`` and the heartbeat list it: its public fields, its id,
    and the scheduler's workload it runs in (``owner``) when it runs in one."""
    owner = registration_owner(workload, proc_root)
    return {**public(workload), "id": workload["id"], **({"owner": owner} if owner else {})}


def slurm_node_of(cgroup: str) -> str:
    """The Slurm node a step's cgroup names (a multiple-slurmd host's layout); "" when it names none."""
    match = SLURM_NODE_RE.search(cgroup)
    return (match.group(1) or match.group(2)) if match else ""


def discover_cgroup_workloads(proc_root: Path = Path("/proc"), node: str = "") -> list[dict[str, Any]]:
    """Slurm job steps and Kubernetes pods, one entry each, from /proc/<pid>/cgroup. With `node` (the
    agent's node, its Slurm NodeName), a step whose cgroup names another node is that node's slurmd's,
    not this agent's; a step whose cgroup names no node runs under the host's one slurmd."""
    found: dict[str, dict[str, Any]] = {}
    for pid, cgroup in _cgroups(proc_root):
        if match := SLURM_RE.search(cgroup):
            if node and slurm_node_of(cgroup) not in ("", node):
                continue
            job, step = match.groups()
            key = f"slurm-{job}.{step}"
            entry = found.setdefault(key, {"id": key, "kind": "slurm_step", "scheduler_id": f"{job}.{step}",
                                           "name": f"job {job} step {step}", "pid": pid, "pids": []})
        elif match := K8S_RE.search(cgroup):
            uid = match.group(1).replace("_", "-")
            key = f"pod-{uid}"
            entry = found.setdefault(key, {"id": key, "kind": "k8s_pod", "scheduler_id": uid, "name": f"pod {uid}",
                                           "pid": pid, "pids": []})
        else:
            continue
        entry["pids"].append(pid)
        entry["pid"] = min(entry["pids"])
    for entry in found.values():
        entry["pids"].sort()
        entry["state"] = "running"
        entry["checkpoint_engine"] = "criu"
    return sorted(found.values(), key=lambda e: e["id"])


def _cgroups(proc_root: Path) -> Iterable[tuple[int, str]]:
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            yield int(entry.name), (entry / "cgroup").read_text()
        except OSError:
            continue


def discover_gpu_processes() -> list[dict[str, Any]]:
    """Processes holding a GPU context, through NVML; nothing when NVML is absent."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - any NVML error means "no GPUs to list"
        return []
    try:
        gpus: dict[int, int] = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                gpus[proc.pid] = gpus.get(proc.pid, 0) + 1
    finally:
        pynvml.nvmlShutdown()
    return [{"id": f"gpu-pid-{pid}", "kind": "gpu_process", "scheduler_id": str(pid), "name": _comm(pid),
             "pid": pid, "gpus": count, "state": "running", "checkpoint_engine": "cuda"} for pid, count in gpus.items()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# ----- GPU users beyond the scheduler's view -----

def cgroup_path(text: str) -> str:
    """The process's cgroup path from /proc/<pid>/cgroup: the v2 entry ("0::"), else the first v1 one."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    unified = [parts[2] for parts in lines if parts[0] == "0" and parts[1] == ""]
    if unified and unified[0] not in ("", "/"):
        return unified[0]
    named = [parts[2] for parts in lines if parts[2] not in ("", "/")]
    return named[0] if named else (unified[0] if unified else "")


def owner_of_cgroup(path: str) -> dict[str, str]:
    """Who a process belongs to, by its cgroup path: {"kind": "k8s_pod", "pod_uid", "container_id"},
    {"kind": "slurm_job", "job_id", "step"} or {"kind": "process"}; always with "cgroup"."""
    if match := K8S_RE.search(path):
        container = CONTAINER_RE.search(path.rstrip("/"))
        return {"kind": "k8s_pod", "pod_uid": match.group(1).replace("_", "-"),
                "container_id": container.group(1) if container else "", "cgroup": path}
    if match := SLURM_JOB_RE.search(path):
        return {"kind": "slurm_job", "job_id": match.group(1), "step": match.group(2) or "", "cgroup": path}
    return {"kind": "process", "cgroup": path}


def device_holders(patterns: list[str], proc_root: Path = Path("/proc")) -> dict[int, list[str]]:
    """pid -> the GPU device files (matching `patterns`) it holds open, from /proc/<pid>/fd."""
    found: dict[int, list[str]] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        held: set[str] = set()
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if any(fnmatch.fnmatchcase(target, p) for p in patterns):
                held.add(target)
        if held:
            found[int(entry.name)] = sorted(held)
    return found


def nvml_compute_pids() -> set[int]:
    """Processes NVML lists as computing on a GPU; none when NVML (nvidia-ml-py) is absent."""
    return {int(w["pid"]) for w in discover_gpu_processes()}


def _ancestors(pid: int, proc_root: Path, limit: int = 64) -> list[int]:
    chain = []
    for _ in range(limit):
        try:
            stat = (proc_root / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            break
        chain.append(pid)
    return chain


def gpu_users(patterns: list[str], registered: list[dict[str, Any]],
              proc_root: Path = Path("/proc")) -> list[dict[str, Any]]:
    """Every process holding a GPU, mapped to its pod, Slurm job or bare process."""
    holders = device_holders(patterns, proc_root)
    nvml = nvml_compute_pids()
    by_pid = {int(w.get("pid") or 0): str(w["id"]) for w in registered
              if w.get("state") in LIVE_STATES and w.get("pid")}
    users = []
    for pid in sorted(set(holders) | nvml):
        try:
            cgroup = (proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            continue  # it ended meanwhile
        workload = next((by_pid[p] for p in [pid, *_ancestors(pid, proc_root)] if p in by_pid), "")
        users.append({"pid": pid, "name": _comm(pid), "uid": _uid(proc_root / str(pid)),
                      "devices": holders.get(pid, []), "nvml": pid in nvml,
                      "owner": owner_of_cgroup(cgroup_path(cgroup)), "workload_id": workload})
    return users


def _uid(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None
