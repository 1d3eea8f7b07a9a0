"""The `local` back end: every node is a gpusweep agent reached over its HTTP API.

Used by the demo and the tests (agents on this machine), and by any static cluster whose nodes
run the agent. Scheduling is the agent's own: maintenance mode stops it admitting work.
"""

from __future__ import annotations

from typing import Any

from gpusweep_agent.transfer import image_digest

from executors import portability
from executors.agent_client import AgentClient, fleet_secret
from executors.base import (
    LIVEPATCH,
    UNDECLARED,
    CheckpointResult,
    Executor,
    GpuUser,
    HealthGates,
    HealthResult,
    NodeRef,
    PatchResult,
    PermanentExecutorError,
    RestoreResult,
    RollbackResult,
    VerifyResult,
    WorkloadInfo,
    dump_summary,
    gpu_users_from,
    health_result,
    is_bare_process,
)

FINGERPRINT_FIELDS = ("engine", "engine_version", "model_name", "model_version")


def owner_of(operation_id: str) -> str:
    """The maintenance owner an operation acts for: its campaign and sweep ("gs-12-34"), or itself."""
    parts = operation_id.split("-")
    return "-".join(parts[:3]) if operation_id.startswith("gs-") and len(parts) > 3 else operation_id


RUNNING_STATES = ("running", "restored")
# The kind of the agent's entry for a bare process holding a GPU (docs/agent-wire-format.md, GET /v1/workloads).
GPU_PROCESS = "gpu_process"


def saved_steps(manifest: dict[str, Any]) -> int | None:
    """The workload's own progress marker in a checkpoint's manifest: the step its registration carries,
    or the step the application put in its signal engine acknowledgement (the demo counter writes
    ``{"step": N}``); None when it reports none."""
    steps = (manifest.get("workload") or {}).get("steps")
    if steps is None:
        ack = (manifest.get("engine_data") or {}).get("ack")
        steps = next((ack[k] for k in ("steps", "step") if k in ack), None) if isinstance(ack, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def workload_info(item: dict[str, Any]) -> WorkloadInfo:
    """A WorkloadInfo from one entry of the agent's GET /v1/workloads."""
    steps = item.get("steps")
    return WorkloadInfo(
        id=str(item.get("id") or item.get("scheduler_id")), name=str(item.get("name", "")),
        gpus=int(item.get("gpus") or 0), checkpoint_engine=str(item.get("checkpoint_engine", "none")),
        state=str(item.get("state", "running")), steps=int(steps) if steps is not None else None,
        fingerprint={k: str(item.get(k, "")) for k in FINGERPRINT_FIELDS},
        requires={str(k): str(v) for k, v in (item.get("requires") or {}).items()}
        if isinstance(item.get("requires"), dict) else {},
        # A bare process the agent found holding a GPU (its gpu_process entries): nobody declared it.
        origin=UNDECLARED if item.get("kind") == GPU_PROCESS else "",
    )


def bare_processes(listed: list[dict[str, Any]]) -> list[WorkloadInfo]:
    """The running bare GPU processes (``gpu_process``) among the agent's GET /v1/workloads entries `listed`."""
    return [workload_info(item) for item in listed
            if item.get("kind") == GPU_PROCESS and item.get("state", "running") in RUNNING_STATES]


class LocalExecutor(Executor):
    name = "local"
    # Agents addressed directly have no scheduler: a stopped workload stays stopped.
    restarts_cold_starts = ""

    def reachable(self, node: NodeRef) -> str:
        if not node.endpoint:
            return "no agent endpoint: the node's agent has never sent a heartbeat and none is configured"
        if self.options.get("secret") is None:
            try:
                fleet_secret()
            except PermanentExecutorError as exc:
                return f"no agent key: {exc}"
        return ""

    def client(self, node: NodeRef) -> AgentClient:
        return AgentClient(
            node.endpoint, node.cluster, node.name,
            secret=self.options.get("secret"),
            request_timeout=float(self.options.get("request_timeout", 10)),
            operation_timeout=float(self.options.get("operation_timeout", 600)),
        )

    def facts(self, node: NodeRef) -> dict[str, str]:
        facts = self.client(node).get("/v1/facts")
        return {str(k): str(v) for k, v in (facts.get("components") or {}).items()}

    def list_workloads(self, node: NodeRef) -> list[WorkloadInfo]:
        answer = self.client(node).get("/v1/workloads")
        # The agent marks a workload it restored "restored" while it runs.
        return [workload_info(item) for item in answer.get("workloads", [])
                if item.get("state", "running") in RUNNING_STATES]

    # -- bare GPU processes on a scheduler's node (the Kubernetes and Slurm back ends call these) --------
    def bare_processes(self, node: NodeRef) -> list[WorkloadInfo]:
        """The bare processes holding a GPU that the node's agent lists as workloads (``gpu-pid-<pid>``: in no
        pod, job or registration; and those it restored after a move), acted on by policy like any other."""
        return bare_processes(self.client(node).get("/v1/workloads").get("workloads", []))

    def own_facts(self, node: NodeRef) -> dict[str, str]:
        """What portability reads of the node as its agent reads them: the agent checks a restore against
        its own facts, so the requirements it records are the rule applied to these (executors.portability)."""
        own = self.client(node).get("/v1/facts")
        return portability.node_facts(str(own.get("gpu_model") or ""),
                                      {str(k): str(v) for k, v in (own.get("components") or {}).items()})

    def checkpoint_bare(self, node: NodeRef, workload_id: str, engine: str, operation_id: str) -> CheckpointResult:
        """A bare GPU process (``gpu-pid-<pid>``) on a scheduler's node, checkpointed by its agent with the
        portability rule applied to the agent's own facts, for the GPUs the agent sees it hold."""
        gpus = next((w.gpus for w in self.bare_processes(node) if w.id == workload_id), 0)
        requires = portability.requirements(engine, self.own_facts(node), gpus=gpus).as_dict()
        return self.checkpoint(node, workload_id, engine, operation_id, requires=requires)

    def holds_bare_checkpoint(self, node: NodeRef, checkpoint_id: str) -> bool:
        """Whether the node's agent reads `checkpoint_id` (its own store, or the one the agents share) as the
        checkpoint of a bare GPU process, which that agent restores itself (``restore``)."""
        try:
            manifest = self.client(node).get(f"/v1/checkpoints/{checkpoint_id}")
        except PermanentExecutorError:  # not in its store
            return False
        return is_bare_process(str((manifest.get("workload") or {}).get("id", "")))

    def gpu_users(self, node: NodeRef) -> list[GpuUser]:
        return gpu_users_from(self.client(node).get("/v1/gpu-users"))

    def maintenance_hold(self, node: NodeRef) -> str:
        holders = self.client(node).get("/v1/health").get("maintenance_holders") or {}
        held = [f"{owner} since {info.get('since', '?')}" + (f": {info['reason']}" if info.get("reason") else "")
                for owner, info in sorted(holders.items())]
        return "agent maintenance held by " + "; ".join(held) if held else ""

    def drain(self, node: NodeRef, operation_id: str) -> None:
        owner = owner_of(operation_id)
        self.client(node).operation("/v1/maintenance", operation_id, enabled=True, owner=owner,
                                    reason=f"gpusweep {owner}")

    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str,
                   requires: dict[str, Any] | None = None) -> CheckpointResult:
        extra = {"requires": requires} if requires is not None else {}
        result = self.client(node).operation(
            "/v1/checkpoint", operation_id, workload_id=workload_id, engine=engine, leave_running=False, **extra
        )
        manifest: dict[str, Any] = result.get("manifest") or {}
        if not result.get("checkpoint_id"):
            raise PermanentExecutorError(f"agent {node.identity} returned no checkpoint id for {workload_id}")
        return CheckpointResult(
            # The image's identity for the evidence, as the receiving agent checks it (transfer.image_digest).
            checkpoint_id=str(result["checkpoint_id"]), sha256=image_digest(manifest),
            total_bytes=int(manifest.get("total_bytes") or 0), steps=saved_steps(manifest), manifest=manifest,
            dump=dump_summary(manifest.get("engine_data") or {}),
        )

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> None:
        # The wire format has no plain stop: a checkpoint with engine "none" stops the workload.
        self.client(node).operation(
            "/v1/checkpoint", operation_id, workload_id=workload_id, engine="none", leave_running=False
        )

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> RestoreResult:
        result = self.client(target).operation("/v1/restore", operation_id, checkpoint_id=checkpoint_id)
        steps = result.get("steps")
        return RestoreResult(
            workload_id=str(result.get("workload_id", "")), node=target.identity,
            steps=int(steps) if steps is not None else None,
        )

    def patch(self, node: NodeRef, component: str, version: str, operation_id: str,
              packages: dict[str, str] | None = None) -> PatchResult:
        # A livepatch is the agent's livepatch method (canonical-livepatch, kpatch), whatever installs packages.
        method = "livepatch" if component == LIVEPATCH else str(self.options.get("patch_method", "package"))
        # The owner names the campaign and sweep: the agent keeps one rollback record per owner.
        extra = {"packages": dict(packages)} if packages else {}
        result = self.client(node).operation(
            "/v1/patch", operation_id, component=component, version=version, method=method, dry_run=False,
            owner=owner_of(operation_id), **extra,
        )
        return PatchResult(
            component=component, before=str(result.get("before", "")), after=str(result.get("after", "")),
            output=str(result.get("output", ""))[:4000],
            packages={str(k): str(v) for k, v in (result.get("packages") or {}).items()},
        )

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        self.client(node).operation("/v1/reboot", operation_id)

    def verify(self, node: NodeRef) -> VerifyResult:
        client = self.client(node)
        health = client.get("/v1/health")
        facts = client.get("/v1/facts")
        versions = {str(k): str(v) for k, v in (facts.get("components") or {}).items()}
        return VerifyResult(healthy=health.get("status") == "ok", versions=versions, output=str(health))

    def health(self, node: NodeRef, expected: dict[str, str], gates: HealthGates,
               operation_id: str) -> HealthResult:
        extra = {"site_checks": list(gates.site_checks)} if gates.site_checks is not None else {}
        answer = self.client(node).operation("/v1/health-checks", operation_id, expected=expected,
                                             gpu_count=node.gpu_count, dcgm_level=gates.dcgm_level, **extra)
        return health_result(answer)

    def rollback(self, node: NodeRef, operation_id: str) -> RollbackResult:
        result = self.client(node).operation("/v1/rollback", operation_id, owner=owner_of(operation_id))
        return RollbackResult(components={str(k): str(v) for k, v in (result.get("components") or {}).items()},
                              reinstalled={str(k): str(v) for k, v in (result.get("reinstalled") or {}).items()},
                              output=str(result.get("output", ""))[:4000],
                              reboot_required=bool(result.get("reboot_required", True)))

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        # Gives back gpusweep's own hold only: anyone else's stays.
        self.client(node).operation("/v1/maintenance", operation_id, enabled=False, owner=owner_of(operation_id))

    def undo(self, node: NodeRef, operation_id: str) -> None:
        self.client(node).operation("/v1/maintenance", operation_id, enabled=False, owner=owner_of(operation_id))
