"""The fleet: clusters, nodes, the versions of their components, and the work on them."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from gpusweep import datagen
from inventory.choices import (
    ChangeAction,
    ChangeSource,
    CheckpointEngine,
    ClusterKind,
    ServiceState,
    WorkloadKind,
    WorkloadPolicy,
)


class Cluster(models.Model):
    """A Slurm or Kubernetes cluster, or a static group of nodes fed from files.

    `connection` holds non-secret settings only (API server URL, kube context, Slurm binary
    folder). Secrets are named, never stored: `secret_env` lists environment variables the
    sync reads at run time (e.g. {"kubeconfig": "GPUSWEEP_KUBECONFIG_PROD"}).
    """

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=ClusterKind.choices())
    description = models.CharField(max_length=200, blank=True)
    connection = models.JSONField(default=dict, blank=True)
    secret_env = models.JSONField(default=dict, blank=True)
    sync_enabled = models.BooleanField(default=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    last_sync_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class PackageSet(models.Model):
    """The installed OS packages of an image, stored once: nodes built from one image share it.

    Keyed by the digest of its content (the ecosystem and every package), so 100,000 nodes in 50
    images are 50 sets, and a heartbeat whose set is known writes no package row.
    """

    digest = models.CharField(max_length=64, unique=True)
    # The OSV ecosystem its packages are versioned in ("Ubuntu:22.04:LTS", "AlmaLinux:9"); '' unknown.
    ecosystem = models.CharField(max_length=64, blank=True, db_index=True)
    os_release = models.JSONField(default=dict, blank=True)  # ID, VERSION_ID, VERSION_CODENAME of /etc/os-release
    package_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["ecosystem", "digest"]

    def __str__(self) -> str:
        return f"{self.ecosystem or 'unknown'} {self.digest[:12]} ({self.package_count} packages)"


class Package(models.Model):
    """One installed binary package of a set, with the source package it was built from."""

    package_set = models.ForeignKey(PackageSet, on_delete=models.CASCADE, related_name="packages")
    name = models.CharField(max_length=200)
    version = models.CharField(max_length=200)
    arch = models.CharField(max_length=32, blank=True)
    # dpkg's ${source:Package} / ${source:Version}; rpm's source RPM name and EVR. '' = the binary's own.
    source = models.CharField(max_length=200, blank=True)
    source_version = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["package_set_id", "name", "arch"]
        # rpm keeps several versions of an installonly package (kernel, kernel-core: three by default).
        constraints = [models.UniqueConstraint(fields=["package_set", "name", "arch", "version"],
                                               name="package_version_unique_per_set")]
        # Advisories look packages up by the source they were built from, or by name (osmatch).
        indexes = [models.Index(fields=["source"], name="package_source_idx"),
                   models.Index(fields=["name"], name="package_name_idx")]

    def __str__(self) -> str:
        return f"{self.name}={self.version}"


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=200)
    pool = models.CharField(max_length=100, blank=True, db_index=True)
    labels = models.JSONField(default=dict, blank=True)
    gpu_model = models.CharField(max_length=100, blank=True, db_index=True)
    gpu_count = models.PositiveIntegerField(default=0)
    # Product line as NVIDIA's bulletins name it: data-center GPUs are "tesla".
    product_line = models.CharField(max_length=40, default="tesla", db_index=True)
    os_family = models.CharField(max_length=20, default="linux", db_index=True)
    # Facts advisories match on besides versions (inventory.versions.KNOWN_FACTS): the GPU
    # architecture, the platform (DGX A100, HGX H100 ...), the container toolkit's mode.
    facts = models.JSONField(default=dict, blank=True)
    # Which source set each owned fact, and the facts two sources disagree on ({fact: {source: value,
    # "since": time}}): inventory.owners. Database defaults: bulk inserts name their columns.
    fact_sources = models.JSONField(default=dict, blank=True, db_default={})
    fact_conflicts = models.JSONField(default=dict, blank=True, db_default={})
    cpu_milli = models.PositiveIntegerField(null=True, blank=True)
    memory_mib = models.PositiveBigIntegerField(null=True, blank=True)
    scheduler_state = models.CharField(max_length=100, blank=True)
    service_state = models.CharField(
        max_length=20, choices=ServiceState.choices(), default=ServiceState.IN_SERVICE, db_index=True
    )
    agent_endpoint = models.URLField(blank=True)
    # SHA-256 of the node's agent token; the token itself lives only on the node.
    agent_token_sha256 = models.CharField(max_length=64, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    # The counter (nonce) of the newest heartbeat accepted from the node's agent: a heartbeat must
    # carry a larger one, so a replayed or older heartbeat changes nothing (inventory/agent.py). A
    # database default as well, for statements that do not name the column.
    heartbeat_counter = models.PositiveBigIntegerField(default=0, db_default=0)
    # The node's own agent's last heartbeat: last_seen is refreshed by scheduler syncs too, so it
    # cannot tell a silent agent from a node its scheduler still lists.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Digest of the content of the node's last full heartbeat (gpusweep_agent.heartbeat.content_digest):
    # a short heartbeat carrying the same digest is answered without reading the node's components.
    # Emptied when another source changes what the agent reports, so the agent sends everything again.
    heartbeat_digest = models.CharField(max_length=64, blank=True, default="", db_default="")
    gone_at = models.DateTimeField(null=True, blank=True)
    # What the node's agent reads of its OS (inventory/packages.py): the image's package set, the
    # kernel running now (uname -r: a fixed kernel installed but not booted fixes nothing) and the
    # livepatch state ({"tool": "canonical-livepatch", "state": "applied", "fixes": [CVE ids],
    # "modules": {...}}). Database defaults: bulk inserts name their columns.
    package_set = models.ForeignKey(PackageSet, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="nodes")
    running_kernel = models.CharField(max_length=100, blank=True, default="", db_default="")
    livepatch = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster_id", "name"]
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_per_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.name}"

    def component_versions(self) -> dict[str, str]:
        return {c.component: c.version for c in self.components.all()}


# The nodes coming and going, and the writes of their identity (gpusweep.datagen.part): what a list
# showing a node only by its id, name and cluster reads of them (the exposure list). A heartbeat
# (last_seen, its counter), a scheduler sync's last_seen or a campaign step's service_state leaves
# it as it was, so such a list's cached answer outlives them.
NODE_IDENTITY = datagen.part(Node._meta.db_table, "identity", columns=("id", "name", "cluster_id"))


class NodeComponent(models.Model):
    """One component version on one node. New components need no migration."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="components")
    component = models.CharField(max_length=63)
    version = models.CharField(max_length=128)
    # Zero-padded sort key (inventory.versions); null when the version did not parse.
    version_key = models.CharField(max_length=200, null=True, blank=True)
    # "R570" for drivers; empty for other components.
    branch = models.CharField(max_length=16, blank=True)
    # Which source last set it: a scheduler sync does not overwrite what the node's agent read.
    source = models.CharField(max_length=20, choices=ChangeSource.choices(), blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["node_id", "component"]
        constraints = [models.UniqueConstraint(fields=["node", "component"], name="component_unique_per_node")]
        indexes = [models.Index(fields=["component", "branch", "version_key"], name="component_range_idx")]

    def __str__(self) -> str:
        return f"{self.component}={self.version}"

    @property
    def flagged(self) -> bool:
        return self.version_key is None


class Workload(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="workloads")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="workloads", null=True, blank=True)
    # Every node the workload holds; `node` is its first (Slurm: batch) node. A multi-node job
    # must keep all its nodes busy in a campaign's eyes, not only the first.
    nodes = models.ManyToManyField(Node, related_name="all_workloads", blank=True)
    kind = models.CharField(max_length=20, choices=WorkloadKind.choices())
    scheduler_id = models.CharField(max_length=200, help_text="Slurm job id, pod namespace/name, or agent id")
    # The scheduler's unique id where its name is not one (a pod's UID): how a node's agent, which sees the
    # UID in a process's cgroup, names the pod its gpusweep-run registration runs in (inventory.identity).
    uid = models.CharField(max_length=64, blank=True, default="", db_default="", db_index=True)
    name = models.CharField(max_length=200, blank=True)
    user = models.CharField(max_length=100, blank=True)
    state = models.CharField(max_length=40, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    time_limit = models.DurationField(null=True, blank=True)
    # No choices here: the engines are a registry (executors.portability), validated by the sources.
    checkpoint_engine = models.CharField(max_length=20, default=CheckpointEngine.NONE)
    policy = models.CharField(max_length=20, choices=WorkloadPolicy.choices(), default=WorkloadPolicy.CHECKPOINT)
    # The controller that starts it again if it stops (Kubernetes: "PyTorchJob kubeflow.org/v1 llama"); "" none.
    owner = models.CharField(max_length=200, blank=True)
    engine = models.CharField(max_length=100, blank=True, help_text="e.g. triton, vllm")
    engine_version = models.CharField(max_length=100, blank=True)
    model_name = models.CharField(max_length=200, blank=True)
    model_version = models.CharField(max_length=100, blank=True)
    # Facts its checkpoint needs of a restore target beyond its engine's ({"gpu_model": "H100"}).
    requires = models.JSONField(default=dict, blank=True)
    # How its volumes let it move, as its scheduler reads them (inventory.sources.kubernetes.Placement):
    # {"requires": {topology fact: value}, "pinned": why it never leaves its node, "notes": [the plan's words]}.
    placement = models.JSONField(default=dict, blank=True, db_default={})
    last_seen = models.DateTimeField(null=True, blank=True)
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster_id", "kind", "scheduler_id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "kind", "scheduler_id"], name="workload_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.scheduler_id}"


class ChangeLog(models.Model):
    """What changed in the inventory, when, and from which source (NetBox ObjectChange-style)."""

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    source = models.CharField(max_length=20, choices=ChangeSource.choices())
    action = models.CharField(max_length=10, choices=ChangeAction.choices())
    object_type = models.CharField(max_length=40)
    object_id = models.BigIntegerField(null=True)
    object_repr = models.CharField(max_length=300)
    changes = models.JSONField(default=dict, help_text="{field: [before, after]}")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    # Who within the source made the change, e.g. "campaign 12, sweep 34" for a campaign's step.
    reference = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id"], name="changelog_object_idx")]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M} {self.source} {self.action} {self.object_repr}"
