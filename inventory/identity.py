"""One identity per workload: the join of a scheduler's workload with its gpusweep-run registration.

A job (or pod) whose payload runs under ``gpusweep-run`` is reported twice: by its scheduler's sync
(Slurm job ``<jobid>``, with its GPUs, user and times) and by its node's agent (the registration
``slurm-<jobid>``, with its checkpoint engine, inference engine and model). It is one workload, so it
is one row: the scheduler's identity, with the fields each source owns (``SCHEDULER_FIELDS``,
``AGENT_FIELDS``). Whichever source reports first creates the row; the other fills in its own fields
and leaves the rest alone; a pod's row is the Kubernetes sync's to create (the agent knows the pod
only by its UID), and a registration waits for it. Everything that names such a workload (the heartbeat, the executors'
``slurm-<jobid>``, the plan, the engine and its evidence) goes through this module to find the row.

A registration in no scheduler's workload stays a process row (its registered id); a process holding
a GPU that nothing declared stays an undeclared GPU user (``choices.bare_process_ref``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from inventory.choices import WorkloadKind

if TYPE_CHECKING:
    from inventory.services import ObservedWorkload

# gpusweep-run's default workload id inside a Slurm job (agent/src/gpusweep_agent/run.py), and the
# Slurm executor's id of the job's workload: it survives a requeue, like the job id.
SLURM_PREFIX = "slurm-"

# The fields a scheduler's sync owns on its workloads; a registration never writes them on a row the
# scheduler reported (its node, GPUs, user, state, times and controller are the scheduler's word).
SCHEDULER_FIELDS = frozenset({"node_id", "name", "user", "state", "gpus", "started_at", "time_limit", "uid", "owner",
                              "placement"})
# The fields a registration owns: what only the payload's wrapper knows. A scheduler's empty value
# ("", "none", {}) never overwrites them (a Slurm job says nothing of its checkpoint engine).
AGENT_FIELDS = frozenset({"checkpoint_engine", "engine", "engine_version", "model_name", "model_version", "requires"})
EMPTY_VALUES: tuple[Any, ...] = ("", "none", {}, None)


def slurm_workload_id(job_id: str) -> str:
    """The agent's and the Slurm executor's id of job `job_id`'s workload."""
    return f"{SLURM_PREFIX}{job_id}"


def slurm_job(workload_id: str) -> str:
    """The job id in a workload id ``slurm-<jobid>``; "" for any other id."""
    job = workload_id.removeprefix(SLURM_PREFIX)
    return job if job != workload_id and job.isdigit() else ""


def registered_in(owner: Any, workload_id: str) -> tuple[str, str] | None:
    """(kind, key) of the scheduler's workload a registration runs in, or None: a Slurm job by its id,
    a pod by its UID (``Workload.uid``: the Kubernetes sync keys pods by namespace/name, which the
    agent cannot see; ``resolve_pods`` finds the row).

    `owner` is what the agent reports of it ({"kind": "slurm_job", "id": "42"}, from the job's
    environment or the process's cgroup); an agent too old to report it is read by gpusweep-run's
    default id ``slurm-<jobid>``.
    """
    if isinstance(owner, dict) and owner.get("kind") in (WorkloadKind.SLURM_JOB, WorkloadKind.K8S_POD):
        key = str(owner.get("id") or "")
        if key.isdigit() if owner["kind"] == WorkloadKind.SLURM_JOB else 0 < len(key) <= 64:
            return str(owner["kind"]), key
        return None
    if not owner and (job := slurm_job(workload_id)):
        return WorkloadKind.SLURM_JOB, job
    return None


def resolve_pods(cluster_id: int, workloads: list[ObservedWorkload]) -> tuple[list[ObservedWorkload], list[str]]:
    """`workloads` with each registration in a pod (kind k8s_pod, scheduler_id its UID) named as the
    Kubernetes sync names the pod; those whose pod the sync has not reported (or has ended) are left out
    and their UIDs returned: they are joined at a later heartbeat."""
    uids = [w.uid for w in workloads if w.kind == WorkloadKind.K8S_POD and w.owns is not None]
    if not uids:
        return workloads, []
    from inventory.models import Workload  # here: executors.base imports this module before the apps load

    names = dict(
        Workload.objects.filter(
            cluster_id=cluster_id, kind=WorkloadKind.K8S_POD, uid__in=uids, gone_at__isnull=True
        ).values_list("uid", "scheduler_id")
    )
    kept = [
        replace(w, scheduler_id=names[w.uid]) if w.uid in names else w
        for w in workloads
        if not (w.kind == WorkloadKind.K8S_POD and w.owns is not None) or w.uid in names
    ]
    return kept, [uid for uid in uids if uid not in names]


def inventory_id(workload_id: str) -> str:
    """The inventory's scheduler id of a workload an executor or agent names `workload_id` (a job's
    ``slurm-<jobid>`` is the job); other ids are the inventory's already."""
    return slurm_job(workload_id) or workload_id
