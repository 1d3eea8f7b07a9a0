"""Kubernetes: nodes with their GPU feature discovery labels, and pods that request GPUs.

Read through the official `kubernetes` client (CoreV1Api, raw JSON pages of 500 with
`continue`, so a large cluster never lands as one response). `KubernetesSource` is the
interface (`nodes()`, `pods()` return API dictionaries); `ApiKubernetesSource` implements it.

Cluster settings (`cluster.connection`, never secrets) and secret references (`secret_env`):
- `connection.host` + `secret_env.token` (name of an environment variable holding a bearer
  token), optional `connection.ca_cert` (path) and `connection.verify_ssl` (default true); or
- `secret_env.kubeconfig` (environment variable holding a kubeconfig path) and optional
  `connection.context`; or nothing: the default kubeconfig ($KUBECONFIG / ~/.kube/config).
- `connection.pool_label`: node label naming the pool (default: the first present of
  gpusweep.io/pool, cloud.google.com/gke-nodepool, eks.amazonaws.com/nodegroup, agentpool,
  node.kubernetes.io/instance-type).
- `connection.timeout_s`: per request (default 30).

Labels read (GPU feature discovery): nvidia.com/gpu.product, nvidia.com/gpu.count,
nvidia.com/cuda.driver-version.full or nvidia.com/cuda.driver.major|minor|rev,
nvidia.com/cuda.runtime-version.full or nvidia.com/cuda.runtime.major|minor; node facts from
nvidia.com/gpu.family (GPU architecture), nvidia.com/gpu.machine (platform) and
gpusweep.io/container-toolkit-mode (legacy|cdi|csv). Kernel and OS come from status.nodeInfo.
Pod annotations gpusweep.io/checkpoint (criu|cuda|signal|none),
gpusweep.io/engine, gpusweep.io/engine-version, gpusweep.io/model, gpusweep.io/model-version
describe what the pod runs; StatefulSet and Job pods count as not checkpointable
(``pod_checkpoint_engine``): their controller recreates them under their own identity.
``api_client_for`` is the one construction of the client, shared with the Kubernetes executor.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any, Protocol

from gpusweep import secret_env
from inventory.choices import CheckpointEngine, ServiceState, WorkloadKind
from inventory.models import Cluster
from inventory.services import ObservedNode, ObservedWorkload, Snapshot

PAGE = 500
GPU_RESOURCE = "nvidia.com/gpu"
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


def node_from_kubernetes(node: dict[str, Any], pool_label: str | None = None) -> ObservedNode:
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


def pod_gpus(pod: dict[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(
            GPU_RESOURCE
        )
        try:
            total += int(value or 0)
        except ValueError:
            continue
    return total


def pod_controller(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the pod's controller (ReplicaSet, StatefulSet, Job, DaemonSet ...), if any."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), None)


def pod_checkpoint_engine(pod: dict[str, Any]) -> str:
    """How a pod's state can be saved: its ``gpusweep.io/checkpoint`` annotation, except that a pod
    whose controller recreates it under its own identity (StatefulSet: its name and volumes; Job:
    its completion) is never copied, so it is not checkpointed: its controller starts it again."""
    controller = pod_controller(pod)
    if controller is not None and controller.get("kind") in ("StatefulSet", "Job"):
        return str(CheckpointEngine.NONE)
    engine = ((pod.get("metadata") or {}).get("annotations") or {}).get("gpusweep.io/checkpoint", "")
    return str(engine) if engine in CheckpointEngine.values() else str(CheckpointEngine.NONE)


def workload_from_pod(pod: dict[str, Any]) -> ObservedWorkload | None:
    gpus = pod_gpus(pod)
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
        checkpoint_engine=pod_checkpoint_engine(pod),
        engine=str(notes.get("gpusweep.io/engine", ""))[:100],
        engine_version=str(notes.get("gpusweep.io/engine-version", ""))[:100],
        model_name=str(notes.get("gpusweep.io/model", ""))[:200],
        model_version=str(notes.get("gpusweep.io/model-version", ""))[:100],
    )


def snapshot_from_kubernetes(source: KubernetesSource, connection: dict[str, Any] | None = None) -> Snapshot:
    pool_label = (connection or {}).get("pool_label")
    nodes = [node_from_kubernetes(node, pool_label) for node in source.nodes()]
    workloads = [w for w in (workload_from_pod(pod) for pod in source.pods()) if w is not None]
    return Snapshot(
        nodes=nodes,
        workloads=workloads,
        complete=True,
        replace_components=False,
        workload_kinds=frozenset({WorkloadKind.K8S_POD}),
    )
