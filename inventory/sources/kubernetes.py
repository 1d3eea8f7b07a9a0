"""Kubernetes: nodes with their GPU feature discovery labels, and pods that request GPUs.

Read through the official `kubernetes` client (CoreV1Api, raw JSON pages of 500 with
`continue`, so a large cluster never lands as one response). `KubernetesSource` is the
interface (`nodes()`, `pods()` return API dictionaries); `ApiKubernetesSource` implements it.

Cluster settings (`cluster.connection`, never secrets) and secret references (`secret_env`), read
in this order (``api_client_for``):
- `connection.in_cluster: true`: the cluster gpusweep runs in, through its pod's service account
  (token and CA under ``GPUSWEEP_KUBE_SERVICE_ACCOUNT_DIR``, the standard
  /var/run/secrets/kubernetes.io/serviceaccount; the API at KUBERNETES_SERVICE_HOST/PORT; the
  token re-read as the kubelet rotates it); an error when gpusweep runs in no pod;
- `connection.host` + `secret_env.token` (name of an environment variable holding a bearer
  token), optional `connection.ca_cert` (path) and `connection.verify_ssl` (default true);
- `secret_env.kubeconfig` (environment variable holding a kubeconfig path) and optional
  `connection.context`;
- none of these: in-cluster when gpusweep runs in a pod (the environment and the token are there),
  else the default kubeconfig ($KUBECONFIG / ~/.kube/config).
- `connection.pool_label`: node label naming the pool (default: the first present of
  gpusweep.io/pool, cloud.google.com/gke-nodepool, eks.amazonaws.com/nodegroup, agentpool,
  node.kubernetes.io/instance-type).
- `connection.timeout_s`: per request (default 30).
- `connection.gpu_resources`: extended resource names that are GPUs at this site besides
  `nvidia.com/gpu`, every `nvidia.com/mig-*` and `nvidia.com/gpu.shared` (e.g. a time-slicing rename).

A pod's GPUs (``pod_gpus``) are counted as the scheduler counts them, over its containers, native
sidecars and init containers, plus the devices of its dynamic resource allocation claims whose device
class is NVIDIA's (``gpu.nvidia.com``, ``mig.nvidia.com``; resource.k8s.io/v1 ResourceClaims).

Labels read (GPU feature discovery): nvidia.com/gpu.product, nvidia.com/gpu.count,
nvidia.com/cuda.driver-version.full or nvidia.com/cuda.driver.major|minor|rev,
nvidia.com/cuda.runtime-version.full or nvidia.com/cuda.runtime.major|minor; node facts from
nvidia.com/gpu.family (GPU architecture), nvidia.com/gpu.machine (platform) and
gpusweep.io/container-toolkit-mode (legacy|cdi|csv). Kernel and OS come from status.nodeInfo.
Pod annotations gpusweep.io/checkpoint (criu|cuda|signal|none),
gpusweep.io/engine, gpusweep.io/engine-version, gpusweep.io/model, gpusweep.io/model-version
describe what the pod runs. A pod of any controller but a ReplicaSet is never copied, so it
counts as not checkpointable (``never_copied``, ``pod_checkpoint_engine``); its controller is the
workload's ``owner``, and a Job's, a known training or serving controller's (PyTorchJob, JobSet,
RayCluster, LeaderWorkerSet ...) or an unknown controller's pod is created with the policy wait
(``owner_policy``).
Volumes (``pod_placement``): a claim whose volume attaches to one node at a time (ReadWriteOnce,
ReadWriteOncePod) makes the pod move stop-first (the original leaves before its replacement starts); a
bound PersistentVolume's ``spec.nodeAffinity.required`` (an unbound claim's StorageClass
``allowedTopologies`` with ``volumeBindingMode: WaitForFirstConsumer``) names the node labels where it
can attach: a topology label (``topology.kubernetes.io/zone`` and ``/region``, the deprecated
``failure-domain.beta.kubernetes.io`` ones, every ``topology.*`` key a CSI driver sets, such as
``topology.gke.io/zone``, and ``connection.topology_labels``) becomes a fact the pod's checkpoint needs
of its receiver, valued as on the pod's node (so a regional volume keeps its pod in the zone it runs in);
nodes report those labels as facts (components named by ``topology_fact``: ``topology_kubernetes_io_zone``).
A local volume, or one keyed by ``kubernetes.io/hostname``, a node's name or a label gpusweep does not
read, pins the pod to its node: it never moves (``portability.PINNED``). The workload's ``placement``
says so for the plan. Listing volumes needs get and list on persistentvolumes and storageclasses
(deploy/kubernetes/rbac.yaml).
``api_client_for`` is the one construction of the client, shared with the Kubernetes executor.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpusweep import secret_env
from inventory.choices import CheckpointEngine, ServiceState, WorkloadKind, WorkloadPolicy
from inventory.models import Cluster
from inventory.services import ObservedNode, ObservedWorkload, Snapshot

PAGE = 500
GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"  # the device plugin's time-slicing rename (renameByDefault)
MIG_PREFIX = "nvidia.com/mig-"
DRA_API = ("resource.k8s.io", "v1")
STORAGE_API = ("storage.k8s.io", "v1")
# Node labels that are facts of where a volume attaches (with every ``topology.*`` key and the site's
# ``connection.topology_labels``); a node's name pins a volume to it.
TOPOLOGY_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region",
                   "failure-domain.beta.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/region")
HOSTNAME_LABEL = "kubernetes.io/hostname"
SINGLE_NODE_MODES = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})
# Pod annotations of the kubelet checkpoint path (executors/kubernetes.py): how a pod is checkpointed, and its
# progress marker in its log, which shows a restore continued its work.
CHECKPOINT_VIA = "gpusweep.io/checkpoint-via"
PROGRESS_PATTERN = "gpusweep.io/progress-pattern"
NO_PROGRESS_MARKER = "restore unverified: no progress marker"
# NVIDIA's DRA driver (k8s-dra-driver-gpu): its driver name and device classes (gpu.nvidia.com, mig.nvidia.com).
DRA_GPU_DRIVERS = ("gpu.nvidia.com", "mig.nvidia.com")
POOL_LABELS = (
    "gpusweep.io/pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "agentpool",
    "node.kubernetes.io/instance-type",
)
_MEMORY_UNITS = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024, "K": 1000 / 1024 / 1024,
                 "M": 1000 * 1000 / 1024 / 1024, "G": 1000**3 / 1024 / 1024}


class KubernetesError(RuntimeError):
    """The API server could not be read; the message names the request."""


class KubernetesSource(Protocol):
    def nodes(self) -> list[dict[str, Any]]: ...

    def pods(self) -> list[dict[str, Any]]: ...

    def resource_claims(self) -> list[dict[str, Any]]: ...

    def persistent_volume_claims(self) -> list[dict[str, Any]]: ...

    def persistent_volumes(self) -> list[dict[str, Any]]: ...

    def storage_classes(self) -> list[dict[str, Any]]: ...


class ApiKubernetesSource:
    def __init__(self, api_client: Any, timeout: float = 30) -> None:
        from kubernetes import client

        self.api = client.CoreV1Api(api_client)
        self.timeout = timeout

    def _list(self, what: str, call: Any, **kwargs: Any) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        items: list[dict[str, Any]] = []
        token = None
        while True:
            page_args = {"limit": PAGE, **kwargs}
            if token:
                page_args["_continue"] = token
            try:
                response = call(_preload_content=False, _request_timeout=self.timeout, **page_args)
                data = json.loads(response.data)
            except ApiException as exc:
                raise KubernetesError(f"GET {what}: HTTP {exc.status} {exc.reason}") from None
            except (HTTPError, OSError) as exc:
                raise KubernetesError(f"GET {what}: {exc}") from None
            except json.JSONDecodeError as exc:
                raise KubernetesError(f"GET {what}: not JSON ({exc})") from None
            items.extend(data.get("items") or [])
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return items

    def nodes(self) -> list[dict[str, Any]]:
        return self._list("/api/v1/nodes", self.api.list_node)

    def pods(self) -> list[dict[str, Any]]:
        return self._list("/api/v1/pods?fieldSelector=status.phase=Running", self.api.list_pod_for_all_namespaces,
                          field_selector="status.phase=Running")

    def persistent_volume_claims(self) -> list[dict[str, Any]]:
        return self._list("/api/v1/persistentvolumeclaims", self.api.list_persistent_volume_claim_for_all_namespaces)

    def persistent_volumes(self) -> list[dict[str, Any]]:
        return self._list("/api/v1/persistentvolumes", self.api.list_persistent_volume)

    def storage_classes(self) -> list[dict[str, Any]]:
        from kubernetes import client

        storage = client.StorageV1Api(self.api.api_client)
        return self._list(f"/apis/{STORAGE_API[0]}/{STORAGE_API[1]}/storageclasses", storage.list_storage_class)

    def resource_claims(self) -> list[dict[str, Any]]:
        """Dynamic resource allocation's claims ([] where the cluster does not serve resource.k8s.io/v1)."""
        from kubernetes import client

        custom = client.CustomObjectsApi(self.api.api_client)
        try:
            return self._list(f"/apis/{DRA_API[0]}/{DRA_API[1]}/resourceclaims", custom.list_cluster_custom_object,
                              group=DRA_API[0], version=DRA_API[1], plural="resourceclaims")
        except KubernetesError as exc:
            if "HTTP 404" in str(exc):
                return []
            raise


def api_client_for(cluster: Cluster) -> tuple[Any, float]:
    """The official client's ApiClient for the cluster's settings, and the per-request timeout.

    One construction for every reader and writer of a cluster (this sync, the Kubernetes
    executor); secrets are read from the environment now, never stored.
    """
    from kubernetes import client, config

    connection = cluster.connection or {}
    secrets = cluster.secret_env or {}
    if own := sorted(v for v in secrets.values() if secret_env.own(str(v))):  # never hand the service's keys on
        raise KubernetesError(f"cluster {cluster.name}: {', '.join(own)} are the service's own settings, not secrets")
    timeout = float(connection.get("timeout_s", 30))
    if connection.get("in_cluster") or not (connection.get("host") or secrets.get("kubeconfig")):
        in_cluster = _in_cluster_client(cluster, required=bool(connection.get("in_cluster")))
        if in_cluster is not None:
            return in_cluster, timeout
    if connection.get("host"):
        configuration = client.Configuration()
        configuration.host = str(connection["host"])
        token_var = secrets.get("token")
        if token_var:
            token = os.environ.get(token_var, "")
            if not token:
                raise KubernetesError(f"cluster {cluster.name}: environment variable {token_var} (token) is not set")
            configuration.api_key = {"BearerToken": token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        configuration.verify_ssl = bool(connection.get("verify_ssl", True))
        if connection.get("ca_cert"):
            configuration.ssl_ca_cert = str(connection["ca_cert"])
        return client.ApiClient(configuration), timeout
    path = None
    if secrets.get("kubeconfig"):
        path = os.environ.get(secrets["kubeconfig"], "")
        if not path:
            raise KubernetesError(
                f"cluster {cluster.name}: environment variable {secrets['kubeconfig']} (kubeconfig path) is not set"
            )
    try:
        api_client = config.new_client_from_config(config_file=path, context=connection.get("context"))
    except (config.ConfigException, OSError) as exc:
        raise KubernetesError(f"cluster {cluster.name}: cannot load kubeconfig: {exc}") from None
    return api_client, timeout


def _in_cluster_client(cluster: Cluster, required: bool) -> Any | None:
    """The client of the pod's own service account (the worker's, as deploy/kubernetes ships it), or None
    when gpusweep runs in no pod and `required` is false."""
    from django.conf import settings
    from kubernetes import client, config

    folder = Path(settings.GPUSWEEP_KUBE_SERVICE_ACCOUNT_DIR)
    token = folder / "token"
    if not (os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT")
            and token.is_file()):
        if required:
            raise KubernetesError(
                f"cluster {cluster.name}: connection.in_cluster is set but gpusweep runs in no pod of it "
                f"(KUBERNETES_SERVICE_HOST/PORT unset or no service account token at {token})")
        return None
    configuration = client.Configuration()
    try:
        # Re-reads the token file as the kubelet rotates it (bound service account tokens last an hour).
        config.incluster_config.InClusterConfigLoader(str(token), str(folder / "ca.crt")).load_and_set(
            configuration)
    except config.ConfigException as exc:
        raise KubernetesError(f"cluster {cluster.name}: in-cluster configuration: {exc}") from None
    return client.ApiClient(configuration)


def client_for(cluster: Cluster) -> ApiKubernetesSource:
    """The inventory's reader for the cluster (``api_client_for``'s connection)."""
    api_client, timeout = api_client_for(cluster)
    return ApiKubernetesSource(api_client, timeout)


def _cpu_milli(value: Any) -> int | None:
    text = str(value or "")
    if not text:
        return None
    try:
        return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)
    except ValueError:
        return None


def _memory_mib(value: Any) -> int | None:
    text = str(value or "")
    for suffix in ("Ki", "Mi", "Gi", "Ti", "K", "M", "G"):
        if text.endswith(suffix):
            try:
                return int(float(text[: -len(suffix)]) * _MEMORY_UNITS[suffix])
            except ValueError:
                return None
    try:
        return int(int(text) / 1024 / 1024) if text else None
    except ValueError:
        return None


FACT_LABELS = {
    "gpu_architecture": "nvidia.com/gpu.family",
    "platform": "nvidia.com/gpu.machine",
    "container_toolkit_mode": "gpusweep.io/container-toolkit-mode",
}


def _joined(labels: dict[str, str], prefix: str, parts: tuple[str, ...]) -> str:
    values = [labels.get(f"{prefix}.{part}", "") for part in parts]
    while values and not values[-1]:
        values.pop()
    return ".".join(values) if values and all(values) else ""


def topology_fact(key: str) -> str:
    """The node fact (a component name: a lower-case identifier) that topology label `key` is kept as:
    ``topology.kubernetes.io/zone`` is ``topology_kubernetes_io_zone``."""
    return re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")


def is_topology_label(key: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether node label `key` is a fact of where volumes attach (a zone, a region, a CSI driver's topology key,
    one of the site's `extra`), one a node component can hold (a name of 63 characters at most)."""
    return (key in TOPOLOGY_LABELS or key.startswith("topology.") or key in extra) and len(topology_fact(key)) <= 63


def topology_labels(connection: dict[str, Any] | None) -> tuple[str, ...]:
    """The site's own topology labels (``connection.topology_labels``), besides the well-known ones."""
    return tuple(str(k) for k in (connection or {}).get("topology_labels") or ())


def node_from_kubernetes(node: dict[str, Any], pool_label: str | None = None,
                         topology: tuple[str, ...] = ()) -> ObservedNode:
    """The node as the inventory keeps it; its topology labels (``is_topology_label``, with the site's
    `topology`) are facts named by their key, which a receiver must share with a volume's node affinity."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels: dict[str, str] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    name = str(meta.get("name", ""))
    components: dict[str, str] = {}
    driver = labels.get("nvidia.com/cuda.driver-version.full") or _joined(
        labels, "nvidia.com/cuda.driver", ("major", "minor", "rev")
    )
    if driver:
        components["driver"] = driver
    cuda = labels.get("nvidia.com/cuda.runtime-version.full") or _joined(
        labels, "nvidia.com/cuda.runtime", ("major", "minor")
    ) or _joined(labels, "nvidia.com/cuda.runtime-version", ("major", "minor"))
    if cuda:
        components["cuda"] = cuda
    info = status.get("nodeInfo") or {}
    if info.get("kernelVersion"):
        components["kernel"] = str(info["kernelVersion"])
    if info.get("osImage"):
        components["os"] = str(info["osImage"])
    # A zone is no version, but the one portability rule matches node components: so it covers volumes too.
    components.update({topology_fact(k): v for k, v in labels.items() if v and is_topology_label(k, topology)})
    capacity = status.get("capacity") or {}
    count_text = labels.get("nvidia.com/gpu.count") or capacity.get(GPU_RESOURCE) or "0"
    try:
        gpu_count = int(count_text)
    except ValueError:
        gpu_count = 0
    pool = ""
    for key in ([pool_label] if pool_label else []) + list(POOL_LABELS):
        if key and labels.get(key):
            pool = labels[key]
            break
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    unschedulable = bool(spec.get("unschedulable"))
    state = ("Ready" if ready else "NotReady") + (",SchedulingDisabled" if unschedulable else "")
    if not ready:
        service = ServiceState.OFFLINE
    elif unschedulable:
        service = ServiceState.DRAINING
    else:
        service = ServiceState.IN_SERVICE
    kept = {k: v for k, v in labels.items() if k.startswith(("nvidia.com/", "gpusweep.io/")) or k == pool_label}
    # GPU feature discovery names the architecture (gpu.family) and the machine; the container
    # toolkit's mode is the site's to label (the GPU Operator's CDI setting is cluster-wide).
    facts = {fact: labels[label] for fact, label in FACT_LABELS.items() if labels.get(label)}
    return ObservedNode(
        name=name,
        components=components,
        pool=pool[:100],
        labels=kept,
        gpu_model=labels.get("nvidia.com/gpu.product", "")[:100],
        gpu_count=gpu_count,
        os_family=str(info.get("operatingSystem") or "linux"),
        cpu_milli=_cpu_milli(capacity.get("cpu")),
        memory_mib=_memory_mib(capacity.get("memory")),
        scheduler_state=state,
        service_state=service,
        facts=facts or None,
        origin=f"Kubernetes node {name!r}",
    )


@dataclass(frozen=True)
class GpuResources:
    """What counts as a GPU in a pod: ``nvidia.com/gpu``, every MIG slice (``nvidia.com/mig-1g.10gb`` ...),
    the device plugin's time-slicing rename ``nvidia.com/gpu.shared``, the site's own names
    (``connection.gpu_resources``, e.g. a renamed shared resource), and the devices of dynamic resource
    allocation claims whose device class is NVIDIA's (``claims``: (namespace, claim) -> devices)."""

    names: tuple[str, ...] = ()
    claims: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def of(cls, connection: dict[str, Any] | None, claims: list[dict[str, Any]] | None = None) -> GpuResources:
        names = (connection or {}).get("gpu_resources") or ()
        return cls(tuple(str(n) for n in names), {
            (str(c["metadata"].get("namespace", "default")), str(c["metadata"]["name"])): count
            for c in claims or [] if (count := claim_gpus(c))})

    def counts(self, resource: str) -> bool:
        return resource in (GPU_RESOURCE, SHARED_GPU_RESOURCE, *self.names) or resource.startswith(MIG_PREFIX)


def claim_gpus(claim: dict[str, Any]) -> int:
    """The NVIDIA devices a ResourceClaim holds: its allocation's results from NVIDIA's DRA driver, else what
    its requests of NVIDIA's device classes ask for (resource.k8s.io v1 ``exactly``, or v1beta1's fields)."""
    allocated = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    results = [r for r in allocated.get("results") or [] if r.get("driver") in DRA_GPU_DRIVERS]
    if results:
        return len(results)
    total = 0
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        wanted = request.get("exactly") or request
        if wanted.get("deviceClassName") in DRA_GPU_DRIVERS:
            total += int(wanted.get("count") or 1) if wanted.get("allocationMode", "ExactCount") == "ExactCount" else 1
    return total


def _requested(container: dict[str, Any], gpu: GpuResources) -> int:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    total = 0
    for name in {*limits, *requests}:
        if gpu.counts(str(name)):
            try:
                total += int(limits.get(name) or requests.get(name) or 0)
            except ValueError:
                continue
    return total


def pod_claims(pod: dict[str, Any]) -> list[str]:
    """The ResourceClaims a pod uses: named ones, and those made for it from a template (its status names)."""
    made = {s.get("name"): s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses")
            or []}
    return [str(c.get("resourceClaimName") or made.get(c.get("name")) or "")
            for c in (pod.get("spec") or {}).get("resourceClaims") or []
            if c.get("resourceClaimName") or made.get(c.get("name"))]


def pod_gpus(pod: dict[str, Any], gpu: GpuResources | None = None) -> int:
    """The GPUs a pod holds as the scheduler counts them: its containers and native sidecars (init containers
    that keep running) together, or its largest plain init container if that is more, plus the NVIDIA
    devices of its resource claims."""
    gpu = gpu or GpuResources()
    spec = pod.get("spec") or {}
    inits = spec.get("initContainers") or []
    running = sum(_requested(c, gpu) for c in [*(spec.get("containers") or []),
                                               *(c for c in inits if c.get("restartPolicy") == "Always")])
    first = max((_requested(c, gpu) for c in inits if c.get("restartPolicy") != "Always"), default=0)
    namespace = str((pod.get("metadata") or {}).get("namespace", "default"))
    return max(running, first) + sum(gpu.claims.get((namespace, name), 0) for name in pod_claims(pod))


def pod_controller(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the pod's controller (ReplicaSet, StatefulSet, Job, DaemonSet ...), if any."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), None)


# The one controller whose pods gpusweep copies: the copy is adopted by the ReplicaSet before the
# original leaves (executors/kubernetes.py), so the ReplicaSet never starts a pod of its own meanwhile.
COPIED_BY_ADOPTION = "ReplicaSet"
# Controllers that start their pods again by their own rules: a StatefulSet under the pod's name and
# volumes, a DaemonSet on its node; gpusweep's rules for them are in executors/kubernetes.py.
RESTARTED_IN_PLACE = ("StatefulSet", "DaemonSet")
# Known controllers of batch, training and serving work by API group. A pod of theirs is never copied
# (the controller would start it again: the work would run twice); it is waited for, or, when the
# campaign allows a cold restart, evicted and started again by its controller (a Job counts it as a
# disruption, the Kubeflow training operator restarts the replica by its restartPolicy, KubeRay and
# LeaderWorkerSet recreate the group member).
KNOWN_CONTROLLERS = {
    "batch": ("Job",),
    "kubeflow.org": ("PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob"),
    "trainer.kubeflow.org": ("TrainJob",),
    "jobset.x-k8s.io": ("JobSet",),
    "ray.io": ("RayCluster", "RayJob"),
    "leaderworkerset.x-k8s.io": ("LeaderWorkerSet",),
}


def pod_owner(pod: dict[str, Any]) -> str:
    """Its controller as the plan shows it ("PyTorchJob kubeflow.org/v1 llama"), "" for a bare pod."""
    controller = pod_controller(pod)
    if controller is None:
        return ""
    return f"{controller.get('kind', '?')} {controller.get('apiVersion', '?')} {controller.get('name', '?')}"[:200]


def never_copied(pod: dict[str, Any]) -> str:
    """Why gpusweep never copies this pod while its controller lives ("" when it may: a bare pod, a
    ReplicaSet's). Every controller but a ReplicaSet would start the pod again beside the copy."""
    controller = pod_controller(pod)
    if controller is None or controller.get("kind") == COPIED_BY_ADOPTION:
        return ""
    kind, group = str(controller.get("kind", "")), str(controller.get("apiVersion", "")).rpartition("/")[0]
    known = kind in KNOWN_CONTROLLERS.get(group or "", ()) or kind in RESTARTED_IN_PLACE
    return (f"it belongs to a {kind} ({pod_owner(pod)}), which starts it again itself" if known else
            f"it belongs to a {kind} ({pod_owner(pod)}), a controller gpusweep does not know")


def owner_policy(pod: dict[str, Any]) -> str:
    """The workload policy its controller implies ("" where the campaign's applies): wait for a Job's pod,
    a known training or serving controller's and an unknown controller's; a cold restart is the
    campaign's to allow (its override or ``cold_restart_allowed`` past the wait limit)."""
    kind = (pod_controller(pod) or {}).get("kind")
    if not never_copied(pod) or kind in RESTARTED_IN_PLACE:
        return ""
    return str(WorkloadPolicy.WAIT)


def pod_checkpoint_engine(pod: dict[str, Any], connection: dict[str, Any] | None = None) -> str:
    """How a pod's state can be saved: its ``gpusweep.io/checkpoint`` annotation, except that a pod
    gpusweep never copies (``never_copied``) is not checkpointed: its controller starts it again. A
    StatefulSet's pod is the exception: its controller starts it again under its name and claims, and
    the new pod's agent restores the checkpoint into it. Where the site requires a progress marker
    (``marker_required``), a kubelet-path pod without one is not checkpointed either."""
    if never_copied(pod) and (pod_controller(pod) or {}).get("kind") != "StatefulSet":
        return str(CheckpointEngine.NONE)
    if marker_required(connection) and kubelet_unverified(pod, connection):
        return str(CheckpointEngine.NONE)
    engine = ((pod.get("metadata") or {}).get("annotations") or {}).get("gpusweep.io/checkpoint", "")
    return str(engine) if engine in CheckpointEngine.values() else str(CheckpointEngine.NONE)


Lookup = Callable[[str], "dict[str, Any] | None"]


@dataclass(frozen=True)
class Placement:
    """How a pod's volumes let it move: the topology facts a receiver must share with its node (``requires``),
    the claims that attach to one node at a time (it moves stop-first), why it cannot leave its node at all
    (``pinned``, "" when it can), and the plan's words for each (``notes``)."""

    requires: dict[str, str] = field(default_factory=dict)
    stop_first: tuple[str, ...] = ()
    pinned: str = ""
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """As the inventory keeps it (``Workload.placement``; executors.portability.placement_requires reads it)."""
        return {k: v for k, v in (("requires", dict(self.requires)), ("pinned", self.pinned),
                                  ("notes", list(self.notes))) if v}


def _volume_keys(volume: dict[str, Any]) -> tuple[list[str], str]:
    """(the node label keys a PersistentVolume's required node affinity names, the node it names by name or ""):
    a local volume names its node by ``kubernetes.io/hostname``."""
    required = (((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {})
    keys, node = [], ""
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == HOSTNAME_LABEL:
                node = node or str((expr.get("values") or [""])[0])
            elif expr.get("key"):
                keys.append(str(expr["key"]))
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name":
                node = node or str((expr.get("values") or [""])[0])
    return keys, node


def _class_keys(storage_class: dict[str, Any]) -> dict[str, list[str]]:
    """key -> allowed values of a WaitForFirstConsumer StorageClass's ``allowedTopologies`` ({} for Immediate)."""
    if storage_class.get("volumeBindingMode") != "WaitForFirstConsumer":
        return {}
    allowed: dict[str, list[str]] = {}
    for term in storage_class.get("allowedTopologies") or []:
        for expr in term.get("matchLabelExpressions") or []:
            allowed.setdefault(str(expr.get("key", "")), []).extend(str(v) for v in expr.get("values") or [])
    return allowed


def pod_placement(pod: dict[str, Any], node_labels: dict[str, str], claim: Callable[[str, str], Any],
                  volume: Lookup, storage_class: Lookup, connection: dict[str, Any] | None = None) -> Placement:
    """Where the pod's volumes let it go (module docstring: Volumes), read through `claim` (namespace, name),
    `volume` and `storage_class` (name -> object or None); `node_labels` are its node's. With `connection`, also
    whether its kubelet-path restore can be verified (``NO_PROGRESS_MARKER``)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    namespace, node = str(meta.get("namespace", "default")), str(spec.get("nodeName") or "")
    extra = topology_labels(connection)
    requires: dict[str, str] = {}
    stop_first: list[str] = []
    pinned = ""
    for item in spec.get("volumes") or []:
        name = (item.get("persistentVolumeClaim") or {}).get("claimName") or (
            f"{meta.get('name')}-{item.get('name')}" if item.get("ephemeral") else "")
        found = claim(namespace, str(name)) if name else None
        if not found:
            continue
        claim_spec = found.get("spec") or {}
        if SINGLE_NODE_MODES & set(claim_spec.get("accessModes") or []):
            stop_first.append(str(name))
        bound = volume(str(claim_spec["volumeName"])) if claim_spec.get("volumeName") else None
        if bound is not None:
            keys, on = _volume_keys(bound)
            local = (bound.get("spec") or {}).get("local")
            if on or local:
                pinned = pinned or (f"volume of claim {name} (PersistentVolume {claim_spec['volumeName']}"
                                    f"{', a local volume' if local else ''}) is pinned to node {on or node}")
            wanted: dict[str, list[str]] = {k: [] for k in keys}
        else:
            wanted = _class_keys(storage_class(str(claim_spec.get("storageClassName") or "")) or {}) if \
                claim_spec.get("storageClassName") else {}
        for key, values in wanted.items():
            here = node_labels.get(key, "")
            if not is_topology_label(key, extra):
                pinned = pinned or (f"volume of claim {name} attaches by node label {key}, which gpusweep does not "
                                    "read as a fact (connection.topology_labels)")
            elif here and (not values or here in values):
                requires[key] = here  # a regional volume: the zone its pod runs in now
            elif len(set(values)) == 1:
                requires[key] = values[0]
    # Facts by their node fact names (the notes say the labels).
    facts = {topology_fact(k): v for k, v in requires.items()}
    notes = []
    if pinned:
        notes.append(f"cannot move: {pinned}")
    elif stop_first:
        where = ", ".join(f"{k} {v}" for k, v in sorted(requires.items()))
        notes.append(f"moves stop-first{f', to {where}' if where else ''}: "
                     f"{', '.join(stop_first)} attach{'es' if len(stop_first) == 1 else ''} to one node at a time")
    elif requires:
        notes.append(f"moves to {', '.join(f'{k} {v}' for k, v in sorted(requires.items()))}, where its volumes attach")
    if connection is not None and kubelet_unverified(pod, connection):
        notes.append(f"not checkpointed: no progress marker ({PROGRESS_PATTERN}), which the site requires "
                     "(require_progress_marker)" if marker_required(connection) else NO_PROGRESS_MARKER)
    return Placement(requires=facts, stop_first=tuple(stop_first), pinned=pinned, notes=tuple(notes))


def checkpoint_via(pod: dict[str, Any], connection: dict[str, Any] | None) -> str:
    """How the pod is checkpointed: its ``gpusweep.io/checkpoint-via`` annotation, else the cluster's
    ``connection.checkpoint_via`` (agent by default), "agent" or "kubelet"."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(CHECKPOINT_VIA) or (connection or {}).get("checkpoint_via") or "agent")


def kubelet_unverified(pod: dict[str, Any], connection: dict[str, Any] | None) -> bool:
    """Whether a kubelet-path restore of the pod could not be verified: it has no progress marker
    (``gpusweep.io/progress-pattern``), so its restore counts once the replacement is Ready."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return checkpoint_via(pod, connection) == "kubelet" and not notes.get(PROGRESS_PATTERN)


def marker_required(connection: dict[str, Any] | None) -> bool:
    """``connection.require_progress_marker``: a kubelet-path pod without a progress marker is not checkpointed."""
    return bool((connection or {}).get("require_progress_marker"))


def _uses_claims(pod: dict[str, Any]) -> bool:
    return any(v.get("persistentVolumeClaim") or v.get("ephemeral") for v in (pod.get("spec") or {}).get("volumes")
               or [])


def workload_from_pod(pod: dict[str, Any], gpu: GpuResources | None = None,
                      connection: dict[str, Any] | None = None) -> ObservedWorkload | None:
    gpus = pod_gpus(pod, gpu)
    if not gpus:
        return None
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    notes = meta.get("annotations") or {}
    started = status.get("startTime")
    deadline = spec.get("activeDeadlineSeconds")
    return ObservedWorkload(
        kind=WorkloadKind.K8S_POD,
        scheduler_id=f"{meta.get('namespace', 'default')}/{meta.get('name', '')}",
        uid=str(meta.get("uid") or "")[:64],
        node=spec.get("nodeName"),
        name=str(meta.get("name", ""))[:200],
        user=str(meta.get("namespace", ""))[:100],
        state=str(status.get("phase", "")).lower(),
        gpus=gpus,
        started_at=dt.datetime.fromisoformat(started.replace("Z", "+00:00")) if started else None,
        time_limit=dt.timedelta(seconds=int(deadline)) if deadline else None,
        checkpoint_engine=pod_checkpoint_engine(pod, connection),
        owner=pod_owner(pod),
        # Without volumes: the kubelet path's note alone (snapshot_from_kubernetes reads the volumes).
        placement=pod_placement(pod, {}, lambda ns, n: None, lambda n: None, lambda n: None, connection).as_dict(),
        default_policy=owner_policy(pod),
        engine=str(notes.get("gpusweep.io/engine", ""))[:100],
        engine_version=str(notes.get("gpusweep.io/engine-version", ""))[:100],
        model_name=str(notes.get("gpusweep.io/model", ""))[:200],
        model_version=str(notes.get("gpusweep.io/model-version", ""))[:100],
    )


def snapshot_from_kubernetes(source: KubernetesSource, connection: dict[str, Any] | None = None) -> Snapshot:
    pool_label = (connection or {}).get("pool_label")
    listed = source.nodes()
    nodes = [node_from_kubernetes(node, pool_label, topology_labels(connection)) for node in listed]
    gpu = GpuResources.of(connection, source.resource_claims())
    pods = source.pods()
    found = [(w, pod) for pod in pods if (w := workload_from_pod(pod, gpu, connection)) is not None]
    claimed = [(w, pod) for w, pod in found if _uses_claims(pod)]
    if claimed:  # volumes read only where a GPU pod has a claim
        labels = {str((n.get("metadata") or {}).get("name")): (n.get("metadata") or {}).get("labels") or {}
                  for n in listed}
        claims = {(str(c["metadata"].get("namespace")), str(c["metadata"]["name"])): c
                  for c in source.persistent_volume_claims()}
        volumes = {str(v["metadata"]["name"]): v for v in source.persistent_volumes()}
        classes = {str(c["metadata"]["name"]): c for c in source.storage_classes()}
        for workload, pod in claimed:
            placement = pod_placement(pod, labels.get(str(workload.node), {}), lambda ns, n: claims.get((ns, n)),
                                      volumes.get, classes.get, connection)
            workload.placement = placement.as_dict()
    workloads = [w for w, _pod in found]
    return Snapshot(
        nodes=nodes,
        workloads=workloads,
        complete=True,
        replace_components=False,
        workload_kinds=frozenset({WorkloadKind.K8S_POD}),
    )
