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
    CRIU = "criu"
    CUDA = "cuda"
    SIGNAL = "signal"
    NONE = "none"
    CHOICES = [
        (CRIU, "CRIU"),
        (CUDA, "CUDA checkpoint + CRIU"),
        (SIGNAL, "Application signal"),
        (NONE, "None (cold restart)"),
    ]


class WorkloadPolicy(ChoiceSet):
    CHECKPOINT = "checkpoint"
    WAIT = "wait"
    COLD_RESTART = "cold_restart"
    CHOICES = [(CHECKPOINT, "Checkpoint and migrate"), (WAIT, "Wait for completion"), (COLD_RESTART, "Cold restart")]


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
