"""The operations a sweep needs from a cluster back end, and how a back end is chosen.

Shaped like Django's email back ends: one base class, back ends named by a dotted path (or a
short alias), chosen per cluster by ``cluster.connection["executor"]`` and otherwise by the
``GPUSWEEP_EXECUTOR`` setting or environment variable, loaded with ``get_executor(cluster)``.

Every mutating operation takes an ``operation_id`` chosen by the caller. A back end must make
repeating an operation id return the first result without doing anything twice: that is what
lets a Celery task be killed at any point and simply run again.

Errors are typed so the campaign engine knows what to do: ``TemporaryExecutorError`` (the agent
did not answer, a timeout) means retry the same step later; ``PermanentExecutorError`` (the
checkpoint failed, the target refused the image, the patch failed) means this node has failed.

Where a checkpoint may be restored is one rule for every back end: ``executors.portability``.
A back end also says, before anything runs, whether it can reach a node at all (``reachable``,
read by the planner) and who restarts a workload that is stopped for a cold start
(``restarts_cold_starts``: a scheduler's requeue, a controller, or nobody).

The contract is a small core every back end implements (the ``Executor`` base class) and optional
capabilities, each a ``typing.Protocol`` a back end implements by having its methods (checked at run
time with ``isinstance``; nothing to register):

- core (``Executor``): ``reachable`` (read by the planner), ``facts``, ``list_workloads``, the sweep's
  steps ``drain``, ``checkpoint``, ``stop``, ``restore``, ``patch``, ``reboot``, ``verify``,
  ``return_to_service``, ``undo``, and ``restarts_cold_starts`` / ``restarted_by``.
- ``SupportsMaintenanceHolds``: ``maintenance_hold`` says why someone other than gpusweep holds a
  node out of service. Without it no node is held (the plan lists none, a swept node keeps none).
- ``SupportsGpuUsers`` (bare, undeclared processes): ``gpu_users`` lists every process holding a GPU,
  declared to a scheduler or not, so the plan shows what the scheduler did not report. Without it the
  planner sees none.
- ``SupportsHealthGates``: ``health`` runs the node's health gates after its reboot (every GPU on the
  expected driver, DCGM diagnostics, the site's own checks where the back end has a node agent), each
  result with its output for the evidence; a failed gate keeps the node out of service. Without it the
  gate is the expected versions only (``versions_gate``).
- ``SupportsRollback``: ``rollback`` reinstalls what the node recorded before its patch (the agent's
  package record, or the GPU Operator's previous driver); the engine then reboots and verifies the old
  versions. Without it a revert fails (a permanent error) and the node stays out of service.
- ``SupportsWaveReservations``: a maintenance reservation per wave (``wave_reservation``,
  ``reserve_wave``, ``release_wave``; Slurm's ``flags=maint``). Without it none is held.

- ``SupportsSchedulerRelease``: ``release_held`` hands a workload held in a checkpoint that no node
  would take back to its scheduler, which starts it again (Slurm: the held job released with its own
  constraints; its gpusweep-run restores the checkpoint where it is valid, else starts it cold).
  Without it such a workload is stranded for an operator.

memory, local, slurm and kubernetes implement every capability; only slurm holds wave reservations and
releases held workloads to its scheduler.

The shared contract every back end passes is ``tests/executors/contract.py``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from executors.portability import node_facts
from inventory import identity
from inventory.choices import bare_process_ref
from inventory.versions import LIVEPATCH, OS_PACKAGES

if TYPE_CHECKING:
    from inventory.models import Cluster

ALIASES = {
    "memory": "executors.memory.MemoryExecutor",
    "local": "executors.local.LocalExecutor",
    "kubernetes": "executors.kubernetes.KubernetesExecutor",
    "slurm": "executors.slurm.SlurmExecutor",
}
DEFAULT_EXECUTOR = "local"


class ExecutorError(Exception):
    """Base of every error a back end raises."""


class TemporaryExecutorError(ExecutorError):
    """The step may succeed if tried again (unreachable agent, timeout, busy)."""


class InterruptedOperation(TemporaryExecutorError):
    """The back end lost the operation midway (its agent restarted) and nothing lasting came of it:
    it may be run again, under a new operation id (the old one stays failed)."""


class PermanentExecutorError(ExecutorError):
    """The step cannot succeed on this node; the node sweep fails (and is undone if not yet patched)."""


@dataclass(frozen=True)
class NodeRef:
    """A node as the back end needs it: identity, where its agent listens, and its known facts."""

    cluster: str
    name: str
    node_id: int | None = None
    endpoint: str = ""
    gpu_model: str = ""
    gpu_count: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    pool: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def identity(self) -> str:
        return f"{self.cluster}/{self.name}"

    @property
    def facts(self) -> dict[str, str]:
        """What portability reads: GPU model and component versions (executors.portability)."""
        return node_facts(self.gpu_model, self.versions)


@dataclass(frozen=True)
class WorkloadInfo:
    id: str
    name: str = ""
    gpus: int = 0
    checkpoint_engine: str = "none"
    state: str = "running"
    # For demo/test workloads that count steps: the last step counted (None when unknown).
    steps: int | None = None
    # What the workload reports of itself: engine, engine_version, model_name, model_version.
    fingerprint: dict[str, str] = field(default_factory=dict)
    # Facts the workload declares its checkpoint needs on top of its engine's (executors.portability).
    requires: dict[str, str] = field(default_factory=dict)
    # "" when its scheduler declared it a GPU workload; UNDECLARED when the node's agent found it holding
    # GPUs it never asked for (the engine records that in the evidence of what it did with it).
    origin: str = ""


# A workload's origin when no scheduler declared its GPUs and the node's agent found it holding some.
UNDECLARED = "undeclared-found-by-agent"
# The id the node's agent gives a bare process holding a GPU (in no pod, job or gpusweep-run registration):
# gpu-pid-<pid>. Every back end with agents acts on it through the agent (LocalExecutor's operations).
BARE_PROCESS = "gpu-pid-"


def is_bare_process(workload_id: str) -> bool:
    """Whether `workload_id` is a bare GPU process the node's agent found (BARE_PROCESS)."""
    return workload_id.startswith(BARE_PROCESS)


def inventory_ref(node_name: str, workload_id: str) -> str:
    """The inventory's (and so the plan's) id of a workload an executor lists on `node_name`: the same
    id, except a bare process, whose pid the inventory qualifies with its node (bare_process_ref), and a
    Slurm job's ``slurm-<jobid>``, which is the job's row (inventory.identity)."""
    if is_bare_process(workload_id):
        return bare_process_ref(node_name, workload_id[len(BARE_PROCESS):])
    return identity.inventory_id(workload_id)


@dataclass(frozen=True)
class CheckpointResult:
    checkpoint_id: str
    sha256: str
    total_bytes: int = 0
    steps: int | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    # How a criu image was taken, for the evidence (dump_summary): {} where the engine says nothing.
    dump: dict[str, Any] = field(default_factory=dict)


def dump_summary(engine_data: dict[str, Any]) -> dict[str, Any]:
    """What the evidence keeps of the agent's account of a criu dump (gpusweep_agent/engines/criu.py): plain or
    with pre-dumps or lazy (and why plain), each round's seconds and pages written, and how long CRIU kept it frozen."""
    dump = engine_data.get("dump")
    if not isinstance(dump, dict):
        return {}
    rounds = [{k: r[k] for k in ("round", "kind", "seconds", "pages_written", "frozen_us") if k in r}
              for r in dump.get("rounds") or [] if isinstance(r, dict)]
    summary = {"mode": dump.get("mode"), "rounds": rounds, "frozen_ms": dump.get("frozen_ms")}
    # Why a lazy move asked of the agent (criu_lazy_pages) became a whole-image one (engines/lazy.py).
    said = {k: v for k, v in (("plain_because", dump.get("plain_because")),
                              ("lazy_because", engine_data.get("lazy_because"))) if v}
    return {**summary, **said}


@dataclass(frozen=True)
class RestoreResult:
    workload_id: str
    node: str
    steps: int | None = None
    # Why the back end could not see the workload's state come back ("" when it did): the evidence says so.
    unverified: str = ""


@dataclass(frozen=True)
class PatchResult:
    component: str
    before: str
    after: str
    output: str = ""
    # The exact packages the patch named, at the versions the node's package manager reports after it.
    packages: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VerifyResult:
    healthy: bool
    versions: dict[str, str]
    output: str = ""


@dataclass(frozen=True)
class HealthGates:
    """What a campaign asks of a node before it returns to service (besides the expected versions)."""

    dcgm_level: int = 0  # `dcgmi diag -r LEVEL`; 0: none
    site_checks: tuple[str, ...] | None = None  # the node's configured site checks by name; None: all


@dataclass(frozen=True)
class HealthCheckResult:
    name: str
    status: str  # passed | failed | skipped
    summary: str = ""
    output: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthResult:
    checks: tuple[HealthCheckResult, ...] = ()

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "failed"]

    @property
    def passed(self) -> bool:
        return not self.failed

    def as_dict(self, output_limit: int = 8000) -> dict[str, Any]:
        """For the evidence: every check with its (tail of) output."""
        return {"passed": self.passed, "failed": self.failed, "checks": [
            {"name": c.name, "status": c.status, "summary": c.summary, "output": c.output[-output_limit:],
             "detail": c.detail} for c in self.checks]}


def version_reached(component: str, want: str, got: str | None) -> bool:
    """Whether a node reporting `got` has the version a patch to `want` was for: the same version, or
    for a livepatch that version or a later one (the agent reports the running livepatch's version)."""
    if component == LIVEPATCH and want.isdigit() and (got or "").isdigit():
        return int(str(got)) >= int(want)
    if component == OS_PACKAGES:
        # No fact reports a set of packages: the patch step had the node's package manager read the
        # versions back, and failed unless they were exactly the ones asked for.
        return True
    return got == want


def versions_check(expected: dict[str, str], versions: dict[str, str]) -> HealthCheckResult:
    """The gate every back end has: each patched component reports the version it was patched to."""
    wrong = {c: {"want": v, "got": versions.get(c, "")} for c, v in sorted(expected.items())
             if not version_reached(c, v, versions.get(c))}
    lines = "\n".join(f"{c}: want {v}, have {versions.get(c) or '(absent)'}" for c, v in sorted(expected.items()))
    if wrong:
        return HealthCheckResult("versions", "failed", f"{len(wrong)} component(s) not at the expected version",
                                 lines, {"wrong": wrong})
    return HealthCheckResult("versions", "passed", "every component at the expected version", lines)


def health_result(answer: dict[str, Any]) -> HealthResult:
    """A HealthResult from the agent's answer (docs/agent-wire-format.md, POST /v1/health-checks)."""
    return HealthResult(tuple(
        HealthCheckResult(name=str(c.get("name", "")), status=str(c.get("status", "failed")),
                          summary=str(c.get("summary", "")), output=str(c.get("output", "")),
                          detail=dict(c.get("detail") or {}))
        for c in answer.get("checks") or []))


@dataclass(frozen=True)
class GpuUser:
    """A process holding a GPU on the node, whoever started it, mapped to its owner by cgroup."""

    pid: int
    name: str = ""
    owner_kind: str = "process"  # k8s_pod | slurm_job | process
    owner_id: str = ""  # the pod (namespace/name where the back end knows it, else its UID), the Slurm job id
    workload_id: str = ""  # the workload registered with the node's agent (gpusweep-run) it belongs to
    devices: tuple[str, ...] = ()
    cgroup: str = ""
    system: bool = False  # a node daemon holding GPUs by design (nvidia-persistenced, nv-hostengine)
    # The workload the back end acts on for it, as its list_workloads names it (WorkloadInfo id and name):
    # the plan looks up its policy as the engine will. "" where the back end knows of none.
    workload_ref: str = ""
    workload_name: str = ""
    # Why the back end leaves it on its node whatever the policy says ("" when it acts on it by policy):
    # a DaemonSet's or a static pod, which the reboot restarts there.
    stays: str = ""


def gpu_users_from(answer: dict[str, Any]) -> list[GpuUser]:
    """GpuUsers from the agent's answer (docs/agent-wire-format.md, GET /v1/gpu-users)."""
    users = []
    for item in answer.get("gpu_users") or []:
        owner = item.get("owner") or {}
        kind = str(owner.get("kind", "process"))
        owner_id = str(owner.get("pod_uid") if kind == "k8s_pod" else owner.get("job_id", "") or "")
        users.append(GpuUser(pid=int(item.get("pid") or 0), name=str(item.get("name", "")), owner_kind=kind,
                             owner_id=owner_id, workload_id=str(item.get("workload_id", "")),
                             devices=tuple(str(d) for d in item.get("devices") or ()),
                             cgroup=str(owner.get("cgroup", "")), system=bool(item.get("system"))))
    return users


# The device file of one GPU (/dev/nvidia0, a stand-in path in tests); nvidiactl and nvidia-uvm are not GPUs.
# The agent counts a bare process's GPUs with the same rule (gpusweep_agent.agent, which cannot import this).
GPU_DEVICE = re.compile(r".*/nvidia\d+")


def owned_by(user: GpuUser, owner_kind: str, owner_id: str, workload_id: str = "") -> bool:
    """Whether `user` belongs to the scheduler's workload `owner_id` of `owner_kind` (its cgroup says so, or it
    runs under the gpusweep-run registration `workload_id`). A node daemon (``system``) belongs to no workload."""
    return not user.system and ((user.owner_kind == owner_kind and user.owner_id == owner_id)
                                or bool(workload_id and user.workload_id == workload_id))


def held_gpus(users: Iterable[GpuUser], owner_kind: str, owner_id: str, workload_id: str = "") -> int:
    """How many GPUs the agent's `users` show a scheduler's workload holding (0: none), found by its cgroup
    (`owner_kind` k8s_pod with the pod's UID, slurm_job with the job id) or by the id it registered with the
    agent through gpusweep-run (`workload_id`). Node daemons (``system``) never count."""
    mine = [u for u in users if owned_by(u, owner_kind, owner_id, workload_id)]
    if not mine:
        return 0
    return len({d for u in mine for d in u.devices if GPU_DEVICE.fullmatch(d)}) or 1


def as_gpu_workload(info: WorkloadInfo, users: Iterable[GpuUser], owner_kind: str, owner_id: str,
                    workload_id: str = "") -> WorkloadInfo | None:
    """`info` as the node's GPU workload: unchanged when its scheduler declared GPUs; with the GPUs the
    agent sees it hold and origin UNDECLARED when it declared none (a pod without an nvidia.com/gpu request,
    a Slurm job without GPU gres), so drain, checkpoint, move, cold restart and wait treat it as a declared
    one; None when it declared none and holds none (not a GPU workload). One rule for every back end."""
    if info.gpus > 0:
        return info
    found = held_gpus(users, owner_kind, owner_id, workload_id)
    return replace(info, gpus=found, origin=UNDECLARED) if found else None


@dataclass(frozen=True)
class RollbackResult:
    components: dict[str, str]  # component -> the version it goes back to
    reinstalled: dict[str, str] = field(default_factory=dict)  # package -> exact version
    output: str = ""
    reboot_required: bool = True


class Executor:
    """Base class of every back end: the core, which every back end implements in full."""

    name = "base"
    # Who starts a workload again after it was stopped for a cold start; "" means nobody (the
    # plan says so, and its owner has to).
    restarts_cold_starts = ""

    def __init__(self, cluster: Cluster | None = None, **options: Any) -> None:
        self.cluster = cluster
        self.options = options

    # -- planning --------------------------------------------------------------------
    def reachable(self, node: NodeRef) -> str:
        """"" when this back end can drive `node`; otherwise why not (no agent endpoint, no key).

        Read at planning time, so the plan lists such nodes as blocked instead of failing them later.
        """
        raise NotImplementedError

    # -- reads -----------------------------------------------------------------------
    def facts(self, node: NodeRef) -> dict[str, str]:
        """The node's current component versions as the node itself reports them."""
        raise NotImplementedError

    def restarted_by(self, workload_id: str) -> str:
        """Who starts `workload_id` again after a cold restart stopped it ("" nobody): restarts_cold_starts,
        except for what the scheduler never ran (a bare process the agent found), which nobody restarts."""
        return "" if is_bare_process(workload_id) else self.restarts_cold_starts

    def list_workloads(self, node: NodeRef) -> list[WorkloadInfo]:
        raise NotImplementedError

    # -- the sweep's steps -----------------------------------------------------------
    def drain(self, node: NodeRef, operation_id: str) -> None:
        """Stop admitting new work on the node (cordon / Slurm drain / agent maintenance)."""
        raise NotImplementedError

    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str,
                   requires: dict[str, Any] | None = None) -> CheckpointResult:
        """Save the workload's running state and stop it on `node`.

        `requires` is what the image needs of a restore target (``Requirements.as_dict()``, computed
        by the engine with executors.portability); the back end records it with the checkpoint and
        refuses a restore where it does not hold. None: the back end computes it from its own facts.
        """
        raise NotImplementedError

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> str | None:
        """Stop a workload without saving its state (cold restart policy). Returns, where the back end knows,
        what the restart does to the workload's output files, for the evidence (None: it does not say)."""
        raise NotImplementedError

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> RestoreResult:
        """Place a checkpointed workload on `target` and resume it there."""
        raise NotImplementedError

    def patch(self, node: NodeRef, component: str, version: str, operation_id: str,
              packages: dict[str, str] | None = None) -> PatchResult:
        """Bring `component` to `version`; with `packages` (name -> exact version: a distribution's fix),
        by installing exactly those."""
        raise NotImplementedError

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        raise NotImplementedError

    def verify(self, node: NodeRef) -> VerifyResult:
        raise NotImplementedError

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        raise NotImplementedError

    def undo(self, node: NodeRef, operation_id: str) -> None:
        """Leave maintenance without patching (abort, or a failure before the patch)."""
        raise NotImplementedError


# -- optional capabilities: a back end has them by having their methods ------------------------
@runtime_checkable
class SupportsMaintenanceHolds(Protocol):
    def maintenance_hold(self, node: NodeRef) -> str:
        """Why the node is out of service for someone other than gpusweep ("" when it is not)."""


@runtime_checkable
class SupportsGpuUsers(Protocol):
    def gpu_users(self, node: NodeRef) -> list[GpuUser]:
        """Every process holding a GPU on the node, declared to a scheduler or not (read at planning
        time, so the plan shows the ones the scheduler did not report, bare processes among them)."""


@runtime_checkable
class SupportsHealthGates(Protocol):
    def health(self, node: NodeRef, expected: dict[str, str], gates: HealthGates,
               operation_id: str) -> HealthResult:
        """Run the node's health gates after its reboot; a failed check is a result, not an error."""


@runtime_checkable
class SupportsRollback(Protocol):
    def rollback(self, node: NodeRef, operation_id: str) -> RollbackResult:
        """Put back what the node recorded before this campaign's patch (a reboot follows)."""


@runtime_checkable
class SupportsWaveReservations(Protocol):
    def wave_reservation(self, campaign_id: int, wave: int) -> str:
        """The name of the maintenance reservation this back end holds for a campaign's wave while it
        runs, "" where it holds none. The plan lists it; the engine calls ``reserve_wave`` when the wave
        is admitted and ``release_wave`` when its last sweep ends or the campaign is aborted."""

    def reserve_wave(self, name: str, nodes: list[NodeRef], minutes: int) -> None:
        """Reserve `nodes` for maintenance from now for `minutes` under `name`; idempotent (a reservation
        of that name already there is kept)."""

    def release_wave(self, name: str) -> None:
        """Delete the reservation `name`; idempotent (none there is fine)."""


def versions_gate(executor: Executor, node: NodeRef, expected: dict[str, str]) -> HealthResult:
    """The health gate of a back end without SupportsHealthGates: the expected versions only."""
    return HealthResult((versions_check(expected, executor.facts(node)),))


def executor_name(cluster: Cluster | None) -> str:
    """The back end's configured name for `cluster`: its connection's "executor", else the setting."""
    if cluster is not None:
        chosen = (cluster.connection or {}).get("executor")
        if chosen:
            # A user writes the connection: only a registered name, never a dotted path to import.
            if not isinstance(chosen, str) or chosen not in ALIASES:
                raise ImproperlyConfigured(f"cluster {cluster.name}: executor {chosen!r} is not one of "
                                           f"{', '.join(sorted(ALIASES))}")
            return chosen
    return str(getattr(settings, "GPUSWEEP_EXECUTOR", "") or os.environ.get("GPUSWEEP_EXECUTOR", DEFAULT_EXECUTOR))


def executor_class(name: str) -> type[Executor]:
    path = ALIASES.get(name, name)
    module_name, _, class_name = path.rpartition(".")
    try:
        cls = getattr(import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImproperlyConfigured(f"executor {name!r} cannot be loaded ({path}): {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Executor)):
        raise ImproperlyConfigured(f"executor {name!r} ({path}) is not an executors.base.Executor")
    return cls


def get_executor(cluster: Cluster | None = None, **options: Any) -> Executor:
    """The back end for `cluster`: its connection's "executor", else the setting, else local."""
    options = {**((cluster.connection or {}).get("executor_options", {}) if cluster else {}), **options}
    return executor_class(executor_name(cluster))(cluster, **options)


@runtime_checkable
class SupportsSchedulerRelease(Protocol):
    def release_held(self, node: NodeRef, workload_id: str, checkpoint_id: str, operation_id: str) -> str:
        """Hand `workload_id`, held in checkpoint `checkpoint_id` taken on `node`, back to its scheduler, which
        starts it again (from the checkpoint where it is valid, else cold); the back end forgets its marks of
        that move. Idempotent. Returns what the scheduler will do, for the evidence."""
