"""One identity per workload: the join of a scheduler's workload with its gpusweep-run registration.

A job (or pod) whose payload runs under ``gpusweep-run`` is reported twice: by its scheduler's sync
(Slurm job ``<jobid>``, with its GPUs, user and times) and by its node's agent (the registration
``slurm-<jobid>``, with its checkpoint engine, inference engine and model). It is one workload, so it
is one row: the scheduler's identity, with the fields each source owns (``SCHEDULER_FIELDS``,
``AGENT_FIELDS``). Whichever source reports first creates the row; the other fills in its own fields
and leaves the rest alone. Everything that names such a workload (the heartbeat, the executors'
``slurm-<jobid>``, the plan, the engine and its evidence) goes through this module to find the row.

A registration in no scheduler's workload stays a process row (its registered id); a process holding
a GPU that nothing declared stays an undeclared GPU user (``choices.bare_process_ref``).
"""

from __future__ import annotations

from typing import Any

from inventory.choices import WorkloadKind

# gpusweep-run's default workload id inside a Slurm job (agent/src/gpusweep_agent/run.py), and the
# Slurm executor's id of the job's workload: it survives a requeue, like the job id.
SLURM_PREFIX = "slurm-"

# The fields a scheduler's sync owns on its workloads; a registration never writes them on a row the
# scheduler reported (its node, GPUs, user, state and times are the scheduler's word).
SCHEDULER_FIELDS = frozenset({"node_id", "name", "user", "state", "gpus", "started_at", "time_limit"})
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
    """(kind, scheduler id) of the scheduler's workload a registration runs in, or None.

    `owner` is what the agent reports of it ({"kind": "slurm_job", "id": "42"}, from the job's
    environment or the process's cgroup); an agent too old to report it is read by gpusweep-run's
    default id ``slurm-<jobid>``. A pod (``k8s_pod``, by UID) is not joined: the Kubernetes sync keys
    pods by namespace/name, which the agent cannot see, so such a registration stays a process row.
    """
    if isinstance(owner, dict) and owner.get("kind") == WorkloadKind.SLURM_JOB and str(owner.get("id", "")).isdigit():
        return WorkloadKind.SLURM_JOB, str(owner["id"])
    if not owner and (job := slurm_job(workload_id)):
        return WorkloadKind.SLURM_JOB, job
    return None


def inventory_id(workload_id: str) -> str:
    """The inventory's scheduler id of a workload an executor or agent names `workload_id` (a job's
    ``slurm-<jobid>`` is the job); other ids are the inventory's already."""
    return slurm_job(workload_id) or workload_id
