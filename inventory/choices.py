from __future__ import annotations

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


class WorkloadKind(ChoiceSet):
    SLURM_JOB = "slurm_job"
    K8S_POD = "k8s_pod"
    PROCESS = "process"
    CHOICES = [(SLURM_JOB, "Slurm job"), (K8S_POD, "Kubernetes pod"), (PROCESS, "Process")]


class CheckpointEngine(ChoiceSet):
    """How a workload is checkpointed. The set of engines is executors.portability's registry (a new
    engine is one EngineRule and a register call, no migration); these names are the built-ins."""

    CRIU = "criu"
    CUDA = "cuda"
    SIGNAL = "signal"
    NONE = "none"

    @classmethod
    def choices(cls) -> list[tuple[str, str]]:
        from executors.portability import ENGINES

        return [(name, rule.label) for name, rule in ENGINES.items()]

    @classmethod
    def values(cls) -> list[str]:
        return [name for name, _label in cls.choices()]


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
