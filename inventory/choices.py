from __future__ import annotations

from typing import ClassVar

from gpusweep.choices import ChoiceSet


class ClusterKind(ChoiceSet):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    STATIC = "static"
    CHOICES = [(SLURM, "Slurm"), (KUBERNETES, "Kubernetes"), (STATIC, "Static (files)")]


class ServiceState(ChoiceSet):
    """What gpusweep knows about a node's availability for work."""

    IN_SERVICE = "in_service"
    DRAINING = "draining"
    PATCHING = "patching"
    OFFLINE = "offline"
    GONE = "gone"
    CHOICES = [
        (IN_SERVICE, "In service"),
        (DRAINING, "Draining"),
        (PATCHING, "Patching"),
        (OFFLINE, "Offline"),
        (GONE, "Gone (no longer reported by its source)"),
    ]
    ACTIVE = frozenset({IN_SERVICE, DRAINING, PATCHING, OFFLINE})
    TERMINAL = frozenset({GONE})


def bare_process_ref(node_name: str, pid: str) -> str:
    """The inventory's id of a bare GPU process (in no pod or job): a pid is unique only on its node.
    Executors name the same process ``gpu-pid-<pid>`` on its node (executors.base.inventory_ref)."""
    return f"{node_name}:pid:{pid}"


class WorkloadKind(ChoiceSet):
    SLURM_JOB = "slurm_job"
    K8S_POD = "k8s_pod"
    PROCESS = "process"
    CHOICES = [(SLURM_JOB, "Slurm job"), (K8S_POD, "Kubernetes pod"), (PROCESS, "Process")]


class CheckpointEngine(ChoiceSet):
    """How a workload is checkpointed. The engines are those registered: executors.portability
    registers each of its rules (a new engine is one EngineRule and a register call, no migration),
    and ExecutorsConfig.ready() imports it. These names are the built-ins."""

    CRIU = "criu"
    CUDA = "cuda"
    SIGNAL = "signal"
    NONE = "none"
    CHOICES: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def register(cls, name: str, label: str) -> None:
        labels = dict(cls.CHOICES)
        labels[name] = label
        cls.CHOICES = list(labels.items())


class WorkloadPolicy(ChoiceSet):
    """What a campaign does with a workload on a node it drains (the one definition: the
    workload's own setting, a campaign's default and its per-workload overrides all use it)."""

    CHECKPOINT = "checkpoint"
    WAIT = "wait"
    COLD_RESTART = "cold_restart"
    CHOICES = [
        (CHECKPOINT, "Checkpoint and migrate"),
        (WAIT, "Wait for completion (up to the limit)"),
        (COLD_RESTART, "Cold restart"),
    ]


class ChangeSource(ChoiceSet):
    FILE = "file"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    AGENT = "agent"
    API = "api"
    ADMIN = "admin"
    CAMPAIGN = "campaign"
    CHOICES = [
        (FILE, "File import"),
        (SLURM, "Slurm sync"),
        (KUBERNETES, "Kubernetes sync"),
        (AGENT, "Node agent"),
        (API, "REST API"),
        (ADMIN, "Admin"),
        (CAMPAIGN, "Campaign"),
    ]


class ChangeAction(ChoiceSet):
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    CHOICES = [(CREATE, "Created"), (UPDATE, "Updated"), (DELETE, "Deleted / gone")]
