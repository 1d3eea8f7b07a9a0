"""The `kubernetes` back end: a node is a Kubernetes node, a workload is a pod that holds GPUs: one
that requests them (``nvidia.com/gpu``, a MIG slice, the site's ``gpu_resources``, in any container, init
container or sidecar, or through a resource claim of NVIDIA's device classes:
``inventory.sources.kubernetes.pod_gpus``), or one its node's agent finds holding a GPU without asking (a
runtime class, a device mounted by hand; ``executors.base.as_gpu_workload``), moved like the others;
and a process the agent finds holding a GPU in no pod (``gpu-pid-<pid>``), which the agents checkpoint,
stop and restore themselves (``LocalExecutor``'s operations, the images in their shared store). A
DaemonSet's or static pod stays on its node (``gpu_users`` says so, for the plan).

It talks to the API server through the official client, built by the inventory sync's
``api_client_for`` (same ``connection`` and ``secret_env``), and to the node agent (a privileged
DaemonSet with ``hostPID``, ``deploy/kubernetes/``) through ``LocalExecutor`` for what only the
node can do: checkpoint a process, install packages, reboot.

Everything gpusweep does is written where the cluster shows it, controller-runtime style, so a
retry reads what the first attempt did and undo removes only gpusweep's own marks:

- drain: cordon, the node label ``gpusweep.io/campaign`` and annotations naming the operation
  (``gpusweep.io/drained-by``), and with ``driver_management: agent`` the taint
  ``gpusweep.io/maintenance=<campaign>:NoSchedule``; a node already cordoned by someone else is noted
  (``gpusweep.io/cordoned-before``) and stays cordoned when gpusweep is done with it. The agent stops
  admitting work (maintenance). With ``gpu-operator`` there is no taint: the operator's operand
  DaemonSets (driver, validator, device plugin) tolerate only the chart's default
  ``nvidia.com/gpu:NoSchedule`` (``daemonsets.tolerations``), so a gpusweep taint would keep the driver
  pod the operator deletes at pod-restart-required from coming back; every DaemonSet pod tolerates the
  cordon (``node.kubernetes.io/unschedulable``, added by the DaemonSet controller). In agent mode
  DaemonSet pods keep running through the taint (NoSchedule evicts nothing, and a reboot keeps pods
  bound); a site DaemonSet whose pods may be deleted on a swept node needs a toleration for
  ``gpusweep.io/maintenance`` (the shipped agent tolerates everything).
- checkpoint, per pod (DaemonSet and static pods never move): first a server-side dry-run
  eviction, so a PodDisruptionBudget that forbids the move holds the node before anything is
  touched; then the node agent (``criu``, ``cuda``, ``signal``; images in the agents' shared
  artifact store, e.g. a PersistentVolume) or, with the pod annotation
  ``gpusweep.io/checkpoint-via: kubelet``, the kubelet's ContainerCheckpoint API through the API
  server's node proxy. The pod is then labelled ``gpusweep.io/checkpoint-id`` and annotated with
  the record (``gpusweep.io/checkpointed``: operation, engine, and the engine's portability
  requirements, which a restore checks against the target's facts). The agent gets the same rule
  applied to its own facts, since it checks a restore against what it reads itself.
- restore: a replacement pod, a copy of the original's spec with a required node affinity to
  the target the engine chose and ``gpusweep.io/restore-from`` naming the checkpoint. A signal
  checkpoint: its container's ``gpusweep-run`` finds the pending checkpoint through its agent and resumes
  it. A criu or cuda checkpoint is restored INTO the replacement's container: the workload's container
  (the one running ``gpusweep-run``, else the first GPU container) runs a placeholder instead of its
  command (``gpusweep-run --hold``, or the pod's ``gpusweep.io/restore-placeholder``, a JSON list), named
  by ``gpusweep.io/restore-into``; once it runs, the target's agent is told its ``containerID`` from the
  pod's status and restores the tree into that container's root, namespaces and cgroups (docs/kubernetes.md)
  (a kubelet checkpoint instead: each container's archive, read under ``kubelet_checkpoint_root``, is
  built into a checkpoint image, checkpointctl's layout, and pushed to ``checkpoint_image_repository`` when
  the checkpoint is taken; the replacement runs that image on a node whose runtime restores it, CRI-O or
  containerd 2.x, read from ``status.nodeInfo.containerRuntimeVersion``). Once it is Running and its agent
  reports the checkpoint restored there (kubelet path: the workload's own progress marker, the pod's
  ``gpusweep.io/progress-pattern`` read from its container log through ``pods/log``, continued past the
  value read before the checkpoint), the original is evicted through the Eviction API;
  a 429 (PodDisruptionBudget) is retried within ``eviction_deadline_s``, then the node fails. The
  replacement's name derives from the checkpoint, so a retry after a crash finds it instead of
  creating a second one; a restore under any other operation id is refused (a checkpoint is
  restored once), and a retried checkpoint finds its record on the restored pod once the original
  is gone. Per controller:

  - none (a bare pod): gpusweep's copy is the replacement.
  - ReplicaSet (a Deployment's): the copy is made without the labels the ReplicaSet selects on
    (kept in ``gpusweep.io/adopt-labels``), so the ReplicaSet never sees one pod too many while it
    starts; once it runs, the original gets the lowest ``controller.kubernetes.io/pod-deletion-cost``
    and the copy gets those labels and the ReplicaSet's owner reference (adopted), then the
    original is evicted.
  - StatefulSet: never copied (its name and claims are its identity). Its pod is checkpointed
    through the agent, then stopped (evicted); its controller starts it again under its name and
    claims, wherever the scheduler can attach them, and that node's agent restores the checkpoint
    into it (``gpusweep-run`` finds it by the workload id); the move succeeds when that node is the
    target the engine chose. Meanwhile the record waits on the pod's claims (label
    ``gpusweep.io/checkpoint-id``), so a retry finds it.
  - any other controller: never copied while it has one (the controller would start the pod again
    beside the copy, and the work would run twice), so it is not checkpointed
    (``inventory.sources.kubernetes.never_copied``). A Job's pod, a known
    training or serving controller's (PyTorchJob and the Kubeflow training operator's kinds, TrainJob,
    JobSet, RayCluster, RayJob, LeaderWorkerSet) and an unknown controller's get the policy wait
    (``owner_policy``) and the plan names the owner; with a cold restart (the campaign's override, or
    ``cold_restart_allowed`` past the wait limit) the pod is evicted and its controller starts it again.
  - DaemonSet: stays on its node.

  A pod with a ReadWriteOnce (or ReadWriteOncePod) claim cannot share its volume with its
  replacement: the replacement is created and pinned first (and adopted, for a ReplicaSet), then the
  original is evicted, and the replacement's containers start once the volume has moved to the target.
  Its volumes' node affinity (``inventory.sources.kubernetes.pod_placement``) adds their topology (a zone)
  to the checkpoint's requirements, so the engine's receiver and the restore's check keep it where its
  volumes attach; a pod pinned to its node (a local volume) is never checkpointed (a permanent error, which
  the engine never meets: no node holds ``portability.PINNED``, so it waits for or cold-starts the pod).
  The copied spec never carries ``ephemeralContainers`` (the API refuses them on create).

  A restore on the pod's own node (the engine unwinding a failed node) is the original itself:
  once the node leaves maintenance its container restarts and restores its pending checkpoint;
  the pod is then marked as a replacement is (``gpusweep.io/restored-from``, the record, the
  operation), so the same guarantees hold.
- patch by ``connection["driver_management"]``: ``agent`` (default: the agent installs the
  packages) or ``gpu-operator`` (containerized drivers): every other GPU node not yet at the
  version gets the operator's skip label ``nvidia.com/gpu-driver-upgrade.skip=true`` (marked
  ``gpusweep.io/upgrade-skip-set-by``, so only those are ever lifted), the version is set on the
  node's ``NVIDIADriver`` (``spec.version``; when the ClusterPolicy sets ``spec.driver.useNvidiaDriverCRD``,
  as the operator reads it) or the ``ClusterPolicy`` (``spec.driver.version``); a policy whose
  ``upgradePolicy.autoUpgrade`` is false is refused before anything changes (nothing would upgrade),
  this node's skip label is lifted and its ``nvidia.com/gpu-driver-upgrade-state`` label followed
  to ``upgrade-done`` (success) or ``upgrade-failed`` (the node fails). gpusweep's checkpoints and
  moves come first (drain, checkpoint and migrate end before the patch), so when the operator's state
  machine reaches pod deletion the node holds no GPU pod; it then cordons (already cordoned: it notes
  the initial state and leaves the cordon to gpusweep), restarts the driver pod and validates. The
  state label is the operator's and never written by gpusweep: a node left ``upgrade-failed`` by an
  earlier upgrade fails at once, saying so. Nodes the campaign never patches keep gpusweep's skip
  label: the operator's upgrade controller never takes a node whose work was not moved. The label does
  not pin a node's driver, though: the DaemonSet's template already names the new version, so a held
  node whose driver pod restarts for another reason (a reboot, a crash) comes back at it.
- health gates: the node agent's checks (docs/agent-wire-format.md), after "the node is Ready";
  without an agent, the expected versions as the node's labels show them. Rollback: the agent
  reinstalls the packages it recorded; with gpu-operator nothing is reinstalled: the operator never
  downgrades a node, so the failed node keeps the driver the upgrade gave it (the pool's resource
  still names that version), gets gpusweep's skip label back and stays out of service; the rollback
  says so.
- reboot through the agent (nothing with gpu-operator: the operator reloads the driver); verify:
  the node is Ready and GPU feature discovery's labels and the agent's facts show the versions;
  return to service and undo: gpusweep's taint, cordon, labels and annotations removed, the agent
  out of maintenance.

Settings: ``connection`` keys ``driver_management``, ``gpu_resources``, ``agents`` (false: no agent on the nodes),
``agent_port`` (17100), ``agent_scheme`` (http), ``gpu_operator`` (``cluster_policy``,
``nvidia_driver`` names), ``checkpoint_via`` (agent; kubelet needs the opt-in ClusterRole of
deploy/kubernetes/optional/kubelet-checkpoint.yaml), ``require_progress_marker`` (a kubelet-path pod without
``gpusweep.io/progress-pattern`` is not checkpointed, and its restore not counted; without it such a restore is
reported unverified), ``topology_labels`` (node labels besides the well-known zone and region and every
``topology.*`` key that a volume's node affinity may name), ``checkpoint_image_repository`` (``host[:port]/path``,
``http://`` in front for a registry without TLS; ``secret_env`` keys ``registry_username`` and
``registry_password``), ``checkpoint_registry_ca``, ``kubelet_checkpoint_root``; the agent
endpoint is the inventory's, else the node annotation ``gpusweep.io/agent-endpoint``, else
``<scheme>://<InternalIP>:<agent_port>``. ``executor_options``: ``eviction_deadline_s`` (300),
``eviction_wait_s`` (10), ``restore_wait_s`` (60), ``upgrade_wait_s`` (60), ``upgrade_timeout_s``
(3600), ``poll_s`` (0.5), and LocalExecutor's agent options. The waits within one call stay
below a campaign's ``step_timeout_s``; the deadlines span the engine's retries.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import hashlib
import itertools
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.core.exceptions import ImproperlyConfigured

from executors import checkpoint_image, portability
from executors.base import (
    CheckpointResult,
    Executor,
    GpuUser,
    HealthCheckResult,
    HealthGates,
    HealthResult,
    NodeRef,
    PatchResult,
    PermanentExecutorError,
    RestoreResult,
    RollbackResult,
    TemporaryExecutorError,
    VerifyResult,
    WorkloadInfo,
    as_gpu_workload,
    held_gpus,
    is_bare_process,
    owned_by,
    versions_check,
)
from executors.local import LocalExecutor
from inventory.sources.kubernetes import (
    DRA_API,
    NO_PROGRESS_MARKER,
    PROGRESS_PATTERN,
    GpuResources,
    KubernetesError,
    Placement,
    api_client_for,
    checkpoint_via,
    marker_required,
    never_copied,
    node_from_kubernetes,
    pod_checkpoint_engine,
    pod_controller,
    pod_gpus,
    pod_placement,
    topology_labels,
)

DRIVER_MANAGEMENT = ("agent", "gpu-operator")
INTO_CONTAINER_ENGINES = ("criu", "cuda")  # process images: restored into the replacement's container
TAINT = "gpusweep.io/maintenance"
CAMPAIGN = "gpusweep.io/campaign"
DRAINED_BY = "gpusweep.io/drained-by"
CORDONED_BEFORE = "gpusweep.io/cordoned-before"
AGENT_ENDPOINT = "gpusweep.io/agent-endpoint"
WORKLOAD_ID = "gpusweep.io/workload-id"
CHECKPOINT_ID = "gpusweep.io/checkpoint-id"  # label on the original
CHECKPOINTED = "gpusweep.io/checkpointed"  # the checkpoint's record on the original
RESTORED_FROM = "gpusweep.io/restored-from"  # label on the replacement
RESTORE_FROM = "gpusweep.io/restore-from"  # what the agent or runtime restores
RESTORED_RECORD = "gpusweep.io/restored-checkpoint"  # the record, on the replacement
RESTORE_INTO = "gpusweep.io/restore-into"  # the replacement's container the agent restores into
RESTORE_PLACEHOLDER = "gpusweep.io/restore-placeholder"  # the site's placeholder command (JSON list)
REPLACES = "gpusweep.io/replaces"
OPERATION = "gpusweep.io/operation"
ADOPT_LABELS = "gpusweep.io/adopt-labels"
EVICTION_BLOCKED = "gpusweep.io/eviction-blocked-since"
SKIP_SET_BY = "gpusweep.io/upgrade-skip-set-by"
PATCH_RECORD = "gpusweep.io/driver-upgrade"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MIRROR = "kubernetes.io/config.mirror"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_SKIP = "nvidia.com/gpu-driver-upgrade.skip"
UPGRADE_BUSY = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
                "pod-restart-required", "validation-required", "uncordon-required", "node-maintenance-required",
                "post-maintenance-required")
AGENT_OPTIONS = ("secret", "request_timeout", "operation_timeout", "patch_method")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def campaign_of(operation_id: str) -> str:
    """The campaign an operation belongs to, as a label value (the engine's ids are gs-<campaign>-...)."""
    match = re.match(r"^gs-(\d+)-", operation_id)
    return f"campaign-{match.group(1)}" if match else label_value(operation_id)


def label_value(text: str) -> str:
    """`text` as a valid label value (63 characters, alphanumeric at both ends)."""
    value = _LABEL_UNSAFE.sub("_", text).strip("_.-")
    if len(value) > 63:
        value = f"{value[:54].rstrip('_.-')}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return value or "x"


def _now() -> float:
    return time.time()


def _pod_name(base: str, key: str) -> str:
    """A pod name derived from `base` and `key`, the same for every retry (DNS label, 63 characters)."""
    return label_value(f"{base}-gs{hashlib.sha256(key.encode()).hexdigest()[:8]}").lower().replace("_", "-")


def _declared(pod: dict[str, Any]) -> dict[str, str]:
    """What the pod declares its checkpoint needs (annotation ``gpusweep.io/requires``, a JSON object)."""
    text = _annotations(pod).get("gpusweep.io/requires") or "{}"
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise PermanentExecutorError(f"pod {_pod_ref(pod)}: annotation gpusweep.io/requires is not a JSON object: "
                                     f"{text[:200]!r}")
    return {str(k): str(v) for k, v in value.items()}


def _claimed(pod: dict[str, Any]) -> bool:
    return any(v.get("persistentVolumeClaim") or v.get("ephemeral") for v in (pod.get("spec") or {}).get("volumes")
               or [])


def _stays(pod: dict[str, Any]) -> str:
    """What keeps the pod on its node whatever the workload policy says ("" for a pod gpusweep moves): a
    DaemonSet's pod or a static pod (its mirror), which the kubelet runs there again after the reboot."""
    if (pod_controller(pod) or {}).get("kind") == "DaemonSet":
        return "a DaemonSet's pod"
    return "a static pod" if MIRROR in _annotations(pod) else ""


def _split(workload_id: str) -> tuple[str, str]:
    namespace, _, name = workload_id.rpartition("/")
    if not namespace or not name:
        raise PermanentExecutorError(f"{workload_id!r} is not a pod (namespace/name)")
    return namespace, name


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = obj.setdefault("metadata", {})
    return meta


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def _ready(obj: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def restores_checkpoints(runtime: str) -> bool:
    """Whether a node's runtime (``status.nodeInfo.containerRuntimeVersion``) restores a container from a
    checkpoint image: CRI-O (since 1.25), containerd from 2.0 (its CRI restore)."""
    name, _, version = runtime.partition("://")
    if name == "cri-o":
        return True
    major = re.match(r"^v?(\d+)", version)
    return name == "containerd" and major is not None and int(major.group(1)) >= 2


def _waiting(pod: dict[str, Any]) -> str:
    """Why the pod's containers wait (an image pull failing, ...), as the kubelet reports it; "" when none does."""
    found = [f"{s.get('name')}: {w.get('reason')} {w.get('message', '')}".strip()
             for s in (pod.get("status") or {}).get("containerStatuses") or []
             if (w := (s.get("state") or {}).get("waiting"))]
    return f" ({'; '.join(found)})" if found else ""


def _pod_ref(pod: dict[str, Any]) -> str:
    return f"{_meta(pod).get('namespace', 'default')}/{_meta(pod)['name']}"


class Answer(Exception):
    """The API server answered with an error status."""

    def __init__(self, what: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{what}: HTTP {status} {message}")
        self.status, self.body = status, body

    def executor_error(self) -> Exception:
        # A 500 is the server's answer about this request (a pod under several PodDisruptionBudgets, a
        # runtime that cannot checkpoint): asking again gets it again, unless the server says when to retry.
        details = self.body.get("details") if isinstance(self.body, dict) else None
        if self.status in (429, 502, 503, 504) or (self.status == 500 and (details or {}).get("retryAfterSeconds")):
            return TemporaryExecutorError(str(self))
        if self.status == 403:
            return PermanentExecutorError(f"{self}; gpusweep's service account lacks this permission "
                                          "(deploy/kubernetes/rbac.yaml grants what the executor needs)")
        return PermanentExecutorError(str(self))


class Kube:
    """The calls the executor makes, as JSON dictionaries, through the official client."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.storage = client.StorageV1Api(api_client)
        self.timeout = timeout

    def call(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False,
             content_type: str | None = None, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        extra = {"_content_type": content_type} if content_type else {}
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self.timeout, **extra, **kwargs)
            return json.loads(response.data or b"null")
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            try:
                body: Any = json.loads(exc.body or b"null")
            except (TypeError, ValueError):
                body = exc.body
            raise Answer(what, int(exc.status or 0), body) from None
        except (HTTPError, OSError) as exc:
            raise TemporaryExecutorError(f"{what}: {exc}") from None

    def node(self, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(f"GET node {name}", self.core.read_node, name, missing_ok=True)
        return result

    def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call(f"PATCH node {name}", self.core.patch_node, name, patch,
                                           content_type="application/merge-patch+json")
        return result

    def nodes(self, label_selector: str = "") -> list[dict[str, Any]]:
        answer = self.call("GET nodes", self.core.list_node, label_selector=label_selector or None)
        return list(answer.get("items") or [])

    def pods(self, *, node: str = "", label_selector: str = "") -> list[dict[str, Any]]:
        answer = self.call("GET pods", self.core.list_pod_for_all_namespaces,
                           field_selector=f"spec.nodeName={node}" if node else None,
                           label_selector=label_selector or None)
        return list(answer.get("items") or [])

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(f"GET pod {namespace}/{name}", self.core.read_namespaced_pod,
                                                  name, namespace, missing_ok=True)
        return result

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(
            f"PATCH pod {namespace}/{name}", self.core.patch_namespaced_pod, name, namespace, patch,
            missing_ok=True, content_type="application/merge-patch+json")
        return result

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.call(f"POST pod {namespace}/{_meta(pod)['name']}",
                                           self.core.create_namespaced_pod, namespace, pod)
        return result

    def evict(self, namespace: str, name: str, dry_run: bool = False) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"dryRun": ["All"]} if dry_run else {}}
        self.call(f"POST eviction of pod {namespace}/{name}" + (" (dry run)" if dry_run else ""),
                  self.core.create_namespaced_pod_eviction, name, namespace, body, missing_ok=True)

    def kubelet(self, node: str, path: str) -> Any:
        return self.call(f"POST node {node} proxy /{path}", self.core.connect_post_node_proxy_with_path, node, path)

    def pod_log(self, namespace: str, name: str, container: str, tail: int) -> str:
        """The container's log (the API server asks the node's kubelet: ``pods/log``)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        what = f"GET pod {namespace}/{name} log of {container}"
        try:
            response: Any = self.core.read_namespaced_pod_log(name, namespace, container=container, tail_lines=tail,
                                                         _preload_content=False, _request_timeout=self.timeout)
            return bytes(response.data or b"").decode(errors="replace")
        except ApiException as exc:
            raise Answer(what, int(exc.status or 0), exc.body) from None
        except (HTTPError, OSError) as exc:
            raise TemporaryExecutorError(f"{what}: {exc}") from None

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(f"GET persistentvolumeclaim {namespace}/{name}",
                                                  self.core.read_namespaced_persistent_volume_claim, name, namespace,
                                                  missing_ok=True)
        return result

    def claims(self, label_selector: str) -> list[dict[str, Any]]:
        answer = self.call("GET persistentvolumeclaims", self.core.list_persistent_volume_claim_for_all_namespaces,
                           label_selector=label_selector)
        return list(answer.get("items") or [])

    def patch_claim(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.call(f"PATCH persistentvolumeclaim {namespace}/{name}",
                  self.core.patch_namespaced_persistent_volume_claim, name, namespace, patch, missing_ok=True,
                  content_type="application/merge-patch+json")

    def persistent_volume(self, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(f"GET persistentvolume {name}", self.core.read_persistent_volume,
                                                  name, missing_ok=True)
        return result

    def storage_class(self, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(f"GET storageclass {name}", self.storage.read_storage_class, name,
                                                  missing_ok=True)
        return result

    def replica_set(self, namespace: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.call(f"GET replicaset {namespace}/{name}",
                                                  self.apps.read_namespaced_replica_set, name, namespace,
                                                  missing_ok=True)
        return result

    def custom_objects(self, group: str, version: str, plural: str) -> list[dict[str, Any]]:
        answer = self.call(f"GET {plural}.{group}", self.custom.list_cluster_custom_object, group, version, plural,
                           missing_ok=True)
        return list((answer or {}).get("items") or [])

    def patch_custom(self, group: str, version: str, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.call(f"PATCH {plural}.{group} {name}", self.custom.patch_cluster_custom_object, group, version, plural,
                  name, patch, content_type="application/merge-patch+json")

    def watch_node(self, name: str, resource_version: str, seconds: float) -> Iterator[dict[str, Any]]:
        """The node's new states from `resource_version` on, for up to `seconds` (a watch)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response: Any = self.core.list_node(
                field_selector=f"metadata.name={name}", watch=True, resource_version=resource_version,
                timeout_seconds=max(1, int(seconds)), _preload_content=False, _request_timeout=self.timeout + seconds)
            buffer = b""
            for chunk in response.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    event = json.loads(line) if line.strip() else {}
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        yield event["object"]
            response.release_conn()
        except (ApiException, HTTPError, OSError, ValueError):
            return  # the caller reads the node again


class KubernetesExecutor(Executor):
    name = "kubernetes"
    restarts_cold_starts = ("its Kubernetes controller (ReplicaSet, StatefulSet, Job, a training operator ...); "
                            "gpusweep starts a fresh copy of a pod that has none")

    def __init__(self, cluster: Any = None, **options: Any) -> None:
        super().__init__(cluster, **options)
        self.connection: dict[str, Any] = dict((cluster.connection or {}) if cluster is not None else {})
        self.mode = str(self.connection.get("driver_management", "agent"))
        if self.mode not in DRIVER_MANAGEMENT:
            raise ImproperlyConfigured(f"driver_management {self.mode!r}: one of {', '.join(DRIVER_MANAGEMENT)}")
        self.agents = LocalExecutor(cluster, **{k: v for k, v in options.items() if k in AGENT_OPTIONS})
        self._kube: Kube | None = None

    def option(self, name: str, default: float) -> float:
        return float(self.options.get(name, default))

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            if self.cluster is None:
                raise PermanentExecutorError("the kubernetes executor needs a cluster (its connection settings)")
            try:
                self._kube = Kube(*api_client_for(self.cluster))
            except KubernetesError as exc:
                raise PermanentExecutorError(str(exc)) from None
        return self._kube

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Answer as exc:
            raise exc.executor_error() from None

    # -- nodes and their agents ------------------------------------------------------
    def _node(self, name: str) -> dict[str, Any]:
        obj = self._call(self.kube.node, name)
        if obj is None:
            raise PermanentExecutorError(f"no node {name!r} in Kubernetes cluster {self.cluster}")
        node: dict[str, Any] = obj
        return node

    def _agent(self, node: NodeRef, obj: dict[str, Any] | None = None) -> NodeRef | None:
        """`node` with its agent's endpoint, or None when the nodes run no agent."""
        if node.endpoint:
            return node
        if self.connection.get("agents") is False:
            return None
        obj = obj or self._node(node.name)
        endpoint = _annotations(obj).get(AGENT_ENDPOINT, "")
        if not endpoint:
            address = next((a["address"] for a in (obj.get("status") or {}).get("addresses") or []
                            if a.get("type") == "InternalIP"), "")
            if not address:
                return None
            endpoint = f"{self.connection.get('agent_scheme', 'http')}://{address}:" \
                       f"{int(self.connection.get('agent_port', 17100))}"
        return replace(node, endpoint=endpoint)

    def _need_agent(self, node: NodeRef, obj: dict[str, Any] | None = None) -> NodeRef:
        ref = self._agent(node, obj)
        if ref is None:
            raise PermanentExecutorError(f"node {node.identity} runs no gpusweep agent (connection agents: false)")
        return ref

    def _update_node(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
        """Read-modify-write with the node's resourceVersion as precondition (taints are one atomic list)."""
        for _ in range(8):
            obj = self._node(name)
            patch = change(obj)
            if not patch:
                return obj
            _meta(patch)["resourceVersion"] = _meta(obj)["resourceVersion"]
            try:
                return self.kube.patch_node(name, patch)
            except Answer as exc:
                if exc.status != 409:
                    raise exc.executor_error() from None
        raise TemporaryExecutorError(f"node {name} kept changing under gpusweep's update; retry")

    def reachable(self, node: NodeRef) -> str:
        try:
            obj = self.kube.node(node.name)
        except (Answer, TemporaryExecutorError, PermanentExecutorError) as exc:
            return f"the Kubernetes API cannot be read: {exc}"
        if obj is None:
            return f"no node {node.name!r} in the Kubernetes cluster"
        if self.connection.get("agents") is not False and self._agent(node, obj) is None:
            return (f"no agent endpoint for node {node.name}: no heartbeat, no {AGENT_ENDPOINT} annotation and no "
                    "InternalIP (or set connection agents: false)")
        return ""

    def maintenance_hold(self, node: NodeRef) -> str:
        obj = self._node(node.name)
        notes, labels, spec = _annotations(obj), _labels(obj), obj.get("spec") or {}
        if spec.get("unschedulable") and DRAINED_BY not in notes:
            return "cordoned by someone other than gpusweep"
        for taint in spec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and taint.get("key") != TAINT \
                    and not str(taint.get("key", "")).startswith("node.kubernetes.io/unschedulable"):
                return f"tainted {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
        if self.mode == "gpu-operator":
            state = labels.get(UPGRADE_STATE, "")
            if state in UPGRADE_BUSY and PATCH_RECORD not in notes:
                return f"the GPU Operator is upgrading its driver ({UPGRADE_STATE}={state})"
            if labels.get(UPGRADE_SKIP) == "true" and SKIP_SET_BY not in notes:
                return f"excluded from driver upgrades by someone other than gpusweep ({UPGRADE_SKIP}=true)"
        return ""

    # -- reads -----------------------------------------------------------------------
    def _observed(self, node: NodeRef, obj: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """(the versions as gpusweep reads them, what GPU feature discovery and the kubelet report, what the
        agent reports). The agent installed host drivers itself; the operator's containerized driver shows in
        GFD's labels first."""
        labels = dict(node_from_kubernetes(obj, None, topology_labels(self.connection)).components)
        ref = self._agent(node, obj)
        agent = self.agents.facts(ref) if ref is not None else {}
        return ({**labels, **agent} if self.mode == "agent" else {**agent, **labels}), labels, agent

    def facts(self, node: NodeRef) -> dict[str, str]:
        return self._observed(node, self._node(node.name))[0]

    def gpu_users(self, node: NodeRef) -> list[GpuUser]:
        """The agent's GPU users, each of a pod of this node named namespace/name (its cgroup shows its UID, or
        its gpusweep-run registered the pod's workload id), with the pod as the workload acted on."""
        ref = self._agent(node)
        if ref is None:
            return []
        pods = self._call(self.kube.pods, node=node.name)
        found = []
        for user in self.agents.gpu_users(ref):
            pod = next((p for p in pods if owned_by(user, "k8s_pod", str(_meta(p).get("uid", "")),
                                                    self._workload_id(p))), None)
            if pod is not None:
                stays = _stays(pod)
                # A pod that stays on its node is no workload gpusweep acts on: the plan says so, not a policy.
                user = replace(user, owner_kind="k8s_pod", owner_id=_pod_ref(pod),
                               workload_ref="" if stays else _pod_ref(pod),
                               workload_name="" if stays else _meta(pod)["name"],
                               stays=f"{stays}: stays on its node, and the reboot restarts it" if stays else "")
            found.append(user)
        return found

    def _portability_facts(self, node: NodeRef) -> dict[str, str]:
        obj = self._node(node.name)
        return portability.node_facts(node_from_kubernetes(obj).gpu_model or node.gpu_model,
                                      self._observed(node, obj)[0])

    def _placement(self, pod: dict[str, Any], node: dict[str, Any] | None = None) -> Placement:
        """Where the pod's volumes let it go (inventory.sources.kubernetes.pod_placement), read live; `node` is
        its node's object when the caller has it."""
        if not _claimed(pod):
            return pod_placement(pod, {}, lambda ns, n: None, lambda n: None, lambda n: None, self.connection)
        on = str((pod.get("spec") or {}).get("nodeName") or "")
        labels = _labels(node if node is not None else (self._call(self.kube.node, on) or {}) if on else {})
        return pod_placement(pod, labels, lambda ns, n: self._call(self.kube.claim, ns, n),
                             lambda n: self._call(self.kube.persistent_volume, n),
                             lambda n: self._call(self.kube.storage_class, n), self.connection)

    def _gpu(self, pods: list[dict[str, Any]]) -> GpuResources:
        """What counts as a GPU here (the site's resource names); NVIDIA's resource claims read only when one of
        `pods` uses a claim."""
        uses = any((p.get("spec") or {}).get("resourceClaims") for p in pods)
        claims = self._call(self.kube.custom_objects, *DRA_API, "resourceclaims") if uses else []
        return GpuResources.of(self.connection, claims)

    def _held_by(self, node: NodeRef, pods: list[dict[str, Any]], gpu: GpuResources | None = None) -> list[GpuUser]:
        """The agent's GPU users when some of `pods` requests no GPU (such a pod may hold GPUs all the same: a
        runtime class, a device mounted by hand); [] when none does or the node runs no agent."""
        gpu = gpu or self._gpu(pods)
        if all(pod_gpus(p, gpu) for p in pods):
            return []
        ref = self._agent(node)
        return self.agents.gpu_users(ref) if ref is not None else []

    def _pod_gpus(self, node: NodeRef, pod: dict[str, Any]) -> int:
        """The GPUs the pod requests, else those the agent sees it hold (by its cgroup's pod UID, or the
        workload id its gpusweep-run registered)."""
        gpu = self._gpu([pod])
        return pod_gpus(pod, gpu) or held_gpus(self._held_by(node, [pod], gpu), "k8s_pod",
                                               str(_meta(pod).get("uid", "")), self._workload_id(pod))

    def list_workloads(self, node: NodeRef) -> list[WorkloadInfo]:
        found = []
        pods = []
        for pod in self._call(self.kube.pods, node=node.name):
            if _meta(pod).get("deletionTimestamp") or _stays(pod) or CHECKPOINT_ID in _labels(pod) \
                    or (pod.get("status") or {}).get("phase") != "Running":
                continue
            pods.append(pod)
        gpu = self._gpu(pods)
        users = self._held_by(node, pods, gpu)
        obj = self._node(node.name) if any(_claimed(p) for p in pods) else None
        for pod in pods:
            meta, notes = _meta(pod), _annotations(pod)
            placement = self._placement(pod, obj)
            info = as_gpu_workload(WorkloadInfo(
                id=_pod_ref(pod), name=meta["name"], gpus=pod_gpus(pod, gpu),
                checkpoint_engine=pod_checkpoint_engine(pod, self.connection),
                fingerprint={"engine": notes.get("gpusweep.io/engine", ""),
                             "engine_version": notes.get("gpusweep.io/engine-version", ""),
                             "model_name": notes.get("gpusweep.io/model", ""),
                             "model_version": notes.get("gpusweep.io/model-version", "")},
                # Its volumes' topology, or PINNED: the one portability rule keeps it where they attach.
                requires={**_declared(pod), **portability.placement_requires(placement.as_dict())},
            ), users, "k8s_pod", str(meta.get("uid", "")), self._workload_id(pod))
            if info is not None:  # a pod that neither requests nor holds a GPU is no GPU workload
                found.append(info)
        # Processes holding a GPU in no pod (started on the host by hand): the agent's, moved through it.
        ref = self._agent(node)
        return found + (self.agents.bare_processes(ref) if ref is not None else [])

    # -- drain, return, undo ---------------------------------------------------------
    def drain(self, node: NodeRef, operation_id: str) -> None:
        campaign = campaign_of(operation_id)
        # With the GPU Operator no taint: its operand DaemonSets tolerate only the chart's `nvidia.com/gpu`
        # (`daemonsets.tolerations`), so a taint of gpusweep's would keep the driver pod the operator deletes
        # at pod-restart-required from coming back. The cordon alone keeps new work off, and every DaemonSet
        # pod tolerates it (node.kubernetes.io/unschedulable, added by the DaemonSet controller).
        wanted = [] if self.mode == "gpu-operator" else [{"key": TAINT, "value": campaign, "effect": "NoSchedule"}]

        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            notes, spec = _annotations(obj), obj.get("spec") or {}
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT]
            if notes.get(DRAINED_BY) == operation_id and spec.get("unschedulable") and taints + wanted == (
                    spec.get("taints") or []):
                return None
            marks = {DRAINED_BY: operation_id, CAMPAIGN: campaign}
            if spec.get("unschedulable") and DRAINED_BY not in notes:
                marks[CORDONED_BEFORE] = "true"
            return {"metadata": {"labels": {CAMPAIGN: campaign}, "annotations": marks},
                    "spec": {"unschedulable": True, "taints": [*taints, *wanted] or None}}

        obj = self._update_node(node.name, change)
        ref = self._agent(node, obj)
        if ref is not None:
            self.agents.drain(ref, operation_id)

    def _release(self, node: NodeRef, operation_id: str) -> None:
        """Remove gpusweep's marks (taint, cordon unless it was there before, labels, annotations)."""
        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            notes, spec = _annotations(obj), obj.get("spec") or {}
            taints = spec.get("taints") or []
            kept = [t for t in taints if t.get("key") != TAINT]
            if DRAINED_BY not in notes and kept == taints and CAMPAIGN not in _labels(obj) \
                    and PATCH_RECORD not in notes:
                return None
            patch: dict[str, Any] = {
                "metadata": {"labels": {CAMPAIGN: None}, "annotations": {
                    DRAINED_BY: None, CAMPAIGN: None, CORDONED_BEFORE: None, PATCH_RECORD: None}},
                "spec": {"taints": kept or None}}
            if notes.get(CORDONED_BEFORE) != "true":
                patch["spec"]["unschedulable"] = None
            return patch

        obj = self._update_node(node.name, change)
        ref = self._agent(node, obj)
        if ref is not None:
            self.agents.return_to_service(ref, operation_id)

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        self._release(node, operation_id)

    def undo(self, node: NodeRef, operation_id: str) -> None:
        self._release(node, operation_id)

    # -- evictions -------------------------------------------------------------------
    def _evict(self, pod: dict[str, Any], dry_run: bool = False) -> None:
        """Evict through the Eviction API; a PodDisruptionBudget's 429 is retried for ``eviction_wait_s``
        in this call and, across calls, until ``eviction_deadline_s`` after the first refusal."""
        namespace, name = _split(_pod_ref(pod))
        until = time.monotonic() + self.option("eviction_wait_s", 10)
        while True:
            try:
                self.kube.evict(namespace, name, dry_run=dry_run)
            except Answer as exc:
                if exc.status != 429:
                    raise exc.executor_error() from None
                if time.monotonic() < until:
                    time.sleep(self.option("poll_s", 0.5))
                    continue
                self._blocked(pod, str(exc))
            else:
                if EVICTION_BLOCKED in _annotations(pod):
                    self._call(self.kube.patch_pod, namespace, name, {"metadata": {"annotations": {
                        EVICTION_BLOCKED: None}}})
                return

    def _blocked(self, pod: dict[str, Any], message: str) -> None:
        namespace, name = _split(_pod_ref(pod))
        since_text = _annotations(pod).get(EVICTION_BLOCKED)
        if since_text is None:
            since_text = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
            self._call(self.kube.patch_pod, namespace, name, {"metadata": {"annotations": {
                EVICTION_BLOCKED: since_text}}})
        waited = _now() - dt.datetime.fromisoformat(since_text).timestamp()
        deadline = self.option("eviction_deadline_s", 300)
        if waited >= deadline:
            raise PermanentExecutorError(f"pod {namespace}/{name}: its PodDisruptionBudget refused eviction for "
                                         f"{waited:.0f} s (deadline {deadline:.0f} s): {message}")
        raise TemporaryExecutorError(f"pod {namespace}/{name}: eviction refused by its PodDisruptionBudget "
                                     f"({message}); retrying until {deadline:.0f} s after the first refusal")

    # -- checkpoint ------------------------------------------------------------------
    def _workload_id(self, pod: dict[str, Any]) -> str:
        """The agent's id of the pod's workload: annotation, the container's GPUSWEEP_WORKLOAD_ID, or its cgroup."""
        notes = _annotations(pod)
        if notes.get(WORKLOAD_ID):
            return notes[WORKLOAD_ID]
        for container in (pod.get("spec") or {}).get("containers") or []:
            for env in container.get("env") or []:
                if env.get("name") == "GPUSWEEP_WORKLOAD_ID" and env.get("value"):
                    return str(env["value"])
        return f"pod-{_meta(pod)['uid']}"

    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str,
                   requires: dict[str, Any] | None = None) -> CheckpointResult:
        if is_bare_process(workload_id):  # in no pod: the node's agent checkpoints it, as with the local back end
            return self.agents.checkpoint_bare(self._need_agent(node), workload_id, engine, operation_id)
        namespace, name = _split(workload_id)
        pod = self._call(self.kube.pod, namespace, name)
        record = json.loads(_annotations(pod).get(CHECKPOINTED) or "{}") if pod is not None else {}
        if record:
            if record.get("op") != operation_id:
                raise PermanentExecutorError(f"pod {workload_id} was already checkpointed by {record.get('op')}")
            return self._result(record, workload_id)
        restored = self._restored_record(workload_id, operation_id)
        if restored:  # a retry after the restore: the record went on with the restored pod
            return self._result(restored, workload_id)
        if pod is None:
            raise PermanentExecutorError(f"pod {workload_id} is gone from {node.name}")
        why = never_copied(pod)
        kind = (pod_controller(pod) or {}).get("kind")
        if why and kind != "StatefulSet":
            raise PermanentExecutorError(f"pod {workload_id} is never copied: {why}; it is waited for, or its "
                                         "controller starts it again after a cold restart (policy cold_restart)")
        placement = self._placement(pod)
        if placement.pinned:  # never checkpointed for nothing: the engine waits for it or cold-starts it
            raise PermanentExecutorError(f"pod {workload_id} cannot move: {placement.pinned}")
        claims = list(placement.stop_first)
        via = checkpoint_via(pod, self.connection)
        if kind == "StatefulSet" and via == "kubelet":
            raise PermanentExecutorError(f"pod {workload_id} belongs to a StatefulSet, whose new pod runs its own "
                                         "image: checkpoint it with the agent (criu, cuda, signal), not the kubelet")
        self._evict(pod, dry_run=True)  # a budget that forbids the move holds the node before anything changes
        gpus = self._pod_gpus(node, pod)
        if requires is None:
            requires = self._requirements(pod, engine, self._portability_facts(node), gpus,
                                          portability.placement_requires(placement.as_dict())).as_dict()
        if via == "kubelet":
            taken = self._kubelet_checkpoint(node, pod)
        else:
            ref = self._need_agent(node)
            # The agent checks a restore against its own facts, so it gets the rule applied to its own.
            mine = self._requirements(pod, engine, self.agents.own_facts(ref), gpus)
            done = self.agents.checkpoint(ref, self._workload_id(pod), engine, operation_id, requires=mine.as_dict())
            taken = {"id": done.checkpoint_id, "sha256": done.sha256, "bytes": done.total_bytes, "steps": done.steps,
                     "dump": done.dump}
        record = {**taken, "op": operation_id, "engine": engine, "via": via, "node": node.name, "pod": workload_id,
                  "requires": requires, "uid": str(_meta(pod).get("uid", "")), "claims": claims,
                  **({"controller": kind} if kind == "StatefulSet" else {})}
        self._call(self.kube.patch_pod, namespace, name, {"metadata": {
            "labels": {CHECKPOINT_ID: record["id"]},
            "annotations": {CHECKPOINTED: json.dumps(record, sort_keys=True), CAMPAIGN: campaign_of(operation_id)}}})
        return self._result(record, workload_id)

    def _restored_record(self, workload_id: str, operation_id: str) -> dict[str, Any]:
        """The record of the checkpoint `operation_id` took of `workload_id`, from the pod restored from it
        (the original is evicted once its replacement runs, and a pod restored at home drops its record)."""
        for pod in self._call(self.kube.pods, label_selector=RESTORED_FROM):
            record: dict[str, Any] = json.loads(_annotations(pod).get(RESTORED_RECORD) or "{}")
            if record.get("op") == operation_id and record.get("pod") == workload_id:
                return record
        return {}

    @staticmethod
    def _requirements(pod: dict[str, Any], engine: str, facts: dict[str, str],
                      gpus: int, volumes: dict[str, str] | None = None) -> portability.Requirements:
        """The portability rule for this pod's image, from its annotations, on a node with `facts`, holding
        `gpus` (requested, or found by the agent); with `volumes`, where its volumes attach."""
        notes = _annotations(pod)
        return portability.requirements(
            engine, facts, gpus=gpus, inference_engine=notes.get("gpusweep.io/engine", ""),
            engine_version=notes.get("gpusweep.io/engine-version", ""), model_name=notes.get("gpusweep.io/model", ""),
            model_version=notes.get("gpusweep.io/model-version", ""),
            requires={**_declared(pod), **(volumes or {})})

    @staticmethod
    def _result(record: dict[str, Any], workload_id: str) -> CheckpointResult:
        steps = record.get("steps")
        return CheckpointResult(
            checkpoint_id=str(record["id"]), sha256=str(record.get("sha256", "")),
            total_bytes=int(record.get("bytes") or 0), steps=int(steps) if steps is not None else None,
            manifest={"pod": workload_id, "node": record.get("node"), "engine": record.get("engine"),
                      "via": record.get("via"), "archives": record.get("archives", []),
                      "requires": record.get("requires", {})}, dump=dict(record.get("dump") or {}))

    def _kubelet_checkpoint(self, node: NodeRef, pod: dict[str, Any]) -> dict[str, Any]:
        """The kubelet's ContainerCheckpoint API through the node proxy, for each GPU container; each archive
        published as a checkpoint image (``executors.checkpoint_image``) in ``checkpoint_image_repository``.
        Nothing is marked on the pod before the push succeeded: a failed push leaves it running and listed."""
        namespace, name = _split(_pod_ref(pod))
        registry = self._registry()
        containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []
                      if pod_gpus({"spec": {"containers": [c]}}, GpuResources.of(self.connection))] or \
                     [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
        # Read before the checkpoint: the container keeps running (and counting) after the kubelet's dump.
        progress = {c: values[-1] for c in containers if (values := self._progress(pod, c))}
        if not progress and marker_required(self.connection):
            # Nothing is dumped: a restore whose state coming back cannot be seen is one the site refuses.
            raise PermanentExecutorError(
                f"pod {namespace}/{name} has no progress marker ({PROGRESS_PATTERN} naming a counter its log shows), "
                "and this cluster requires one to verify a kubelet restore (connection.require_progress_marker): "
                "it is not checkpointed")
        archives: dict[str, str] = {}
        for container in containers:
            try:
                answer = self.kube.kubelet(node.name, f"checkpoint/{namespace}/{name}/{container}")
            except Answer as exc:
                if exc.status == 404:
                    raise PermanentExecutorError(
                        f"the kubelet on {node.name} has no checkpoint API (feature gate ContainerCheckpoint, and a "
                        f"runtime with CRIU): {exc}") from None
                if exc.status == 403:
                    raise PermanentExecutorError(
                        f"the kubelet checkpoint path needs create on nodes/proxy, which gpusweep's service account "
                        f"lacks: apply the opt-in ClusterRole of deploy/kubernetes/optional/kubelet-checkpoint.yaml, "
                        f"or checkpoint through the agent (checkpoint_via: agent): {exc}") from None
                if exc.status == 500:  # the runtime failed the dump (no CRIU, a container CRIU cannot dump)
                    raise PermanentExecutorError(f"the runtime on {node.name} could not checkpoint {namespace}/"
                                                 f"{name}/{container}: {exc}") from None
                raise exc.executor_error() from None
            for path in (answer or {}).get("items") or []:
                archives[container] = str(path)
        if not archives:
            raise PermanentExecutorError(f"the kubelet on {node.name} returned no checkpoint archive for {namespace}/"
                                         f"{name}")
        digest = hashlib.sha256("\n".join(archives.values()).encode()).hexdigest()
        checkpoint_id = f"kubelet-{digest[:20]}"
        images, total = {}, 0
        for container, path in archives.items():
            # Pushed while the archive's file is there: its layer is read from it in chunks, never held whole.
            with self._archive(node, path) as archive:
                image = checkpoint_image.build(archive, container, {
                    "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": name,
                    "io.gpusweep.checkpoint-id": checkpoint_id})
                total += image.layer.size
                try:
                    images[container] = registry.push(image, f"{checkpoint_id}-{container}")
                except checkpoint_image.RegistryError as exc:
                    raise PermanentExecutorError(
                        f"checkpoint image of {namespace}/{name}/{container} not published: {exc}; the pod keeps "
                        f"running on {node.name}") from None
        return {"id": checkpoint_id, "sha256": digest, "archives": list(archives.values()),
                "containers": list(archives), "images": images, "progress": progress, "bytes": total, "steps": None}

    def _registry(self) -> checkpoint_image.Registry:
        """Where kubelet checkpoints are published: ``checkpoint_image_repository`` (``host[:port]/path``, with
        ``http://`` for a registry without TLS), credentials from the cluster's ``secret_env``
        (``registry_username``, ``registry_password``), ``checkpoint_registry_ca`` for a private CA."""
        text = str(self.connection.get("checkpoint_image_repository") or "")
        if not text:
            raise PermanentExecutorError("set connection.checkpoint_image_repository: where each kubelet checkpoint "
                                         "archive is published as an OCI image for the runtime to restore")
        try:
            repository = checkpoint_image.Repository.parse(text)
        except ValueError as exc:
            raise PermanentExecutorError(str(exc)) from None
        secrets = dict(getattr(self.cluster, "secret_env", None) or {})
        return checkpoint_image.Registry(
            repository, os.environ.get(str(secrets.get("registry_username", "")), "") if secrets.get(
                "registry_username") else "",
            os.environ.get(str(secrets.get("registry_password", "")), "") if secrets.get("registry_password") else "",
            str(self.connection.get("checkpoint_registry_ca") or ""))

    @contextlib.contextmanager
    def _archive(self, node: NodeRef, path: str) -> Iterator[Path]:
        """The kubelet's archive (on the node, in /var/lib/kubelet/checkpoints) where the worker reads it: fetched
        from the node's agent (``GET /v1/kubelet-checkpoints/<name>``), or without agents under
        ``kubelet_checkpoint_root``, each node's checkpoint folder by node name (a volume they are exported to)."""
        name = Path(path).name
        root = str(self.connection.get("kubelet_checkpoint_root") or "")
        ref = None if root else self._agent(node)
        if ref is not None:
            with tempfile.TemporaryDirectory(prefix="gpusweep-kubelet-") as folder:
                target = Path(folder) / name
                self.agents.client(ref).download(f"/v1/kubelet-checkpoints/{quote(name)}", target)
                yield target
            return
        if not root:
            raise PermanentExecutorError(f"node {node.name} runs no agent to read its kubelet checkpoint archives: "
                                         "set connection.kubelet_checkpoint_root (<root>/<node>/<archive>)")
        found = Path(root) / node.name / name
        if not found.is_file():
            raise PermanentExecutorError(f"the kubelet on {node.name} wrote {path}, but the worker finds no {found}")
        yield found

    def _progress(self, pod: dict[str, Any], container: str) -> list[int]:
        """The workload's own progress marker, from its container's log: each line that the pod's
        ``gpusweep.io/progress-pattern`` (a regular expression) matches gives its first group as a number.
        [] without the annotation."""
        pattern = _annotations(pod).get(PROGRESS_PATTERN)
        if not pattern:
            return []
        try:
            rule = re.compile(pattern)
        except re.error as exc:
            raise PermanentExecutorError(f"pod {_pod_ref(pod)}: {PROGRESS_PATTERN} {pattern!r}: {exc}") from None
        text = self._call(self.kube.pod_log, *_split(_pod_ref(pod)), container, 500)
        return [int(m.group(1)) for line in text.splitlines() if (m := rule.search(line)) and m.group(1).isdigit()]

    def _progress_continued(self, pod: dict[str, Any], record: dict[str, Any]) -> bool:
        """Whether each container restored from `record` continued its progress marker past the value read before
        the checkpoint (False while it has logged none). A run that starts at or below it was started afresh: the
        runtime did not restore it, which no wait mends."""
        for container, before in (record.get("progress") or {}).items():
            values = self._progress(pod, container)
            if not values:
                return False
            if values[0] <= int(before) or any(b <= a for a, b in itertools.pairwise(values)):
                raise PermanentExecutorError(
                    f"pod {_pod_ref(pod)}/{container} did not continue from checkpoint {record['id']}: its progress "
                    f"runs {values[0]}..{values[-1]}, and it had reached {before} before the checkpoint (started "
                    "afresh, not restored)")
        return True

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> None:
        """Cold restart: the pod's controller starts it again; a pod without one is copied, unpinned; a bare
        process is stopped by its agent and nobody starts it again (``restarted_by``)."""
        if is_bare_process(workload_id):
            self.agents.stop(self._need_agent(node), workload_id, operation_id)
            return
        namespace, name = _split(workload_id)
        pod = self._call(self.kube.pod, namespace, name)
        if pod is None:
            return
        if pod_controller(pod) is None:
            copy_name = _pod_name(name, operation_id)
            fresh = self._copy(pod, copy_name, {REPLACES: workload_id, OPERATION: operation_id,
                                                CAMPAIGN: campaign_of(operation_id)}, {})
            try:
                self.kube.create_pod(namespace, fresh)
            except Answer as exc:
                if exc.status != 409:
                    raise exc.executor_error() from None
        self._evict(pod)

    # -- restore ---------------------------------------------------------------------
    def _find(self, label: str, value: str) -> dict[str, Any] | None:
        pods = self._call(self.kube.pods, label_selector=f"{label}={value}")
        live = [p for p in pods if not _meta(p).get("deletionTimestamp")]
        return live[0] if live else None

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> RestoreResult:
        replacement = self._find(RESTORED_FROM, checkpoint_id)
        original = self._find(CHECKPOINT_ID, checkpoint_id)
        record = json.loads(_annotations(replacement).get(RESTORED_RECORD, "{}") if replacement else
                            _annotations(original).get(CHECKPOINTED, "{}") if original else "{}")
        if not record:  # a StatefulSet's pod already stopped: its record waits on its claims
            marked = self._call(self.kube.claims, f"{CHECKPOINT_ID}={checkpoint_id}")
            record = json.loads(_annotations(marked[0]).get(CHECKPOINTED, "{}")) if marked else {}
            if record:
                return self._restore_by_controller(None, record, target, operation_id)
        if not record:
            ref = self._agent(target)
            if ref is not None and self.agents.holds_bare_checkpoint(ref, checkpoint_id):
                # A bare process's (in no pod): the target's agent restores it from the agents' shared store.
                return self.agents.restore(ref, checkpoint_id, operation_id)
            raise PermanentExecutorError(f"no pod carries checkpoint {checkpoint_id} (neither its original nor a "
                                         "replacement)")
        done_by = _annotations(replacement).get(OPERATION, operation_id) if replacement else operation_id
        if replacement and done_by != operation_id:
            # A checkpoint is restored once: only a retry of that restore finds its pod.
            raise PermanentExecutorError(
                f"checkpoint {checkpoint_id} was restored already, as pod {_pod_ref(replacement)} on "
                f"{(replacement.get('spec') or {}).get('nodeName')} by operation {done_by}")
        wrong = portability.mismatches(portability.from_dict(record["requires"]), self._portability_facts(target))
        if wrong:
            report = ", ".join(f"{k}: {want!r} != {got!r}" for k, (want, got) in sorted(wrong.items()))
            raise PermanentExecutorError(f"checkpoint {checkpoint_id} cannot be restored on {target.name}: {report}")
        unverified = NO_PROGRESS_MARKER if record.get("via") == "kubelet" and not record.get("progress") else ""
        if unverified and marker_required(self.connection):
            raise PermanentExecutorError(
                f"checkpoint {checkpoint_id} of {record.get('pod')} has no progress marker to verify its restore by, "
                "and this cluster requires one (connection.require_progress_marker): not restored")
        if replacement is None and original is not None and (original.get("spec") or {}).get("nodeName") == \
                target.name:
            # Home again (the engine unwinding): the original's container restarts and restores its checkpoint.
            self._wait_restored(original, record, target)
            # Marked as a replacement is, so a retry finds this restore and any other is refused.
            self._call(self.kube.patch_pod, *_split(_pod_ref(original)), {"metadata": {
                "labels": {CHECKPOINT_ID: None, RESTORED_FROM: checkpoint_id},
                "annotations": {CHECKPOINTED: None, EVICTION_BLOCKED: None, OPERATION: operation_id,
                                RESTORED_RECORD: json.dumps(record, sort_keys=True)}}})
            return RestoreResult(workload_id=_pod_ref(original), node=target.identity, unverified=unverified)
        if replacement is None and record.get("controller") == "StatefulSet":
            return self._restore_by_controller(original, record, target, operation_id)
        if replacement is None:
            if original is None:
                raise PermanentExecutorError(f"the pod checkpointed as {checkpoint_id} is gone")
            replacement = self._create_replacement(original, record, target, operation_id)
        elif (replacement.get("spec") or {}).get("nodeName") not in (None, target.name):
            raise PermanentExecutorError(f"checkpoint {checkpoint_id} was restored as {_pod_ref(replacement)} on "
                                         f"{replacement['spec']['nodeName']}, not {target.name}")
        if original is not None and record.get("claims"):
            # A volume that attaches to one node at a time: the original stops first (its ReplicaSet adopts the
            # waiting replacement before), then the volume moves and the replacement's containers start.
            self._hand_over(original, replacement)
            self._evict(original)
            original = None
        self._wait_restored(replacement, record, target, operation_id)
        if original is not None:
            self._hand_over(original, replacement)
            self._evict(original)
        return RestoreResult(workload_id=_pod_ref(replacement), node=target.identity, unverified=unverified)

    def _restore_by_controller(self, original: dict[str, Any] | None, record: dict[str, Any], target: NodeRef,
                               operation_id: str) -> RestoreResult:
        """A StatefulSet's pod is never copied: the original stops, its controller starts the pod again under
        its name with its claims, where they can attach, and the node's agent restores the checkpoint into it
        (``gpusweep-run`` finds it by the workload id). The record waits on the claims meanwhile, so a retry
        finds it."""
        checkpoint_id, (namespace, name) = str(record["id"]), _split(str(record["pod"]))
        marks = {"metadata": {"labels": {CHECKPOINT_ID: checkpoint_id}, "annotations": {
            CHECKPOINTED: json.dumps(record, sort_keys=True)}}}
        for claim in record.get("claims") or []:
            self._call(self.kube.patch_claim, namespace, claim, marks)
        if original is not None:
            self._evict(original)
        current = self._call(self.kube.pod, namespace, name)
        if current is None or _meta(current).get("uid") == record.get("uid") or _meta(current).get(
                "deletionTimestamp"):
            raise TemporaryExecutorError(f"pod {namespace}/{name} stopped for checkpoint {checkpoint_id}; its "
                                         "StatefulSet has not started it again yet")
        landed = (current.get("spec") or {}).get("nodeName")
        if landed and landed != target.name:
            raise PermanentExecutorError(f"the StatefulSet started pod {namespace}/{name} on {landed}, not on "
                                         f"{target.name}: its agent there restores checkpoint {checkpoint_id}")
        self._wait_restored(current, record, target)
        self._call(self.kube.patch_pod, namespace, name, {"metadata": {
            "labels": {RESTORED_FROM: checkpoint_id},
            "annotations": {OPERATION: operation_id, RESTORED_RECORD: json.dumps(record, sort_keys=True)}}})
        for claim in record.get("claims") or []:
            self._call(self.kube.patch_claim, namespace, claim, {"metadata": {
                "labels": {CHECKPOINT_ID: None}, "annotations": {CHECKPOINTED: None}}})
        return RestoreResult(workload_id=f"{namespace}/{name}", node=target.identity)

    def _copy(self, pod: dict[str, Any], name: str, annotations: dict[str, str],
              labels: dict[str, str]) -> dict[str, Any]:
        """A new pod with the original's spec (unbound) and metadata, minus gpusweep's marks on the original."""
        meta = _meta(pod)
        spec = copy.deepcopy(pod.get("spec") or {})
        spec.pop("nodeName", None)
        spec.pop("ephemeralContainers", None)  # debugging containers: never set on create (a 422)
        kept_labels = {k: v for k, v in _labels(pod).items() if k != CHECKPOINT_ID}
        kept_notes = {k: v for k, v in _annotations(pod).items()
                      if k not in (CHECKPOINTED, EVICTION_BLOCKED, DELETION_COST, MIRROR, RESTORE_INTO)}
        return {"apiVersion": "v1", "kind": "Pod", "spec": spec, "metadata": {
            "name": name, "namespace": meta.get("namespace", "default"), "labels": {**kept_labels, **labels},
            "annotations": {**kept_notes, **annotations}}}

    def _create_replacement(self, original: dict[str, Any], record: dict[str, Any], target: NodeRef,
                            operation_id: str) -> dict[str, Any]:
        checkpoint_id = str(record["id"])
        namespace, name = _split(_pod_ref(original))
        new_name = _pod_name(name, checkpoint_id)
        pod = self._copy(original, new_name, {
            RESTORE_FROM: checkpoint_id, RESTORED_RECORD: json.dumps(record, sort_keys=True),
            REPLACES: _pod_ref(original), OPERATION: operation_id, CAMPAIGN: campaign_of(operation_id),
        }, {RESTORED_FROM: checkpoint_id})
        _pin(pod, target.name)
        controller = pod_controller(original)
        if controller is not None and controller.get("kind") == "ReplicaSet":
            owner = self._call(self.kube.replica_set, namespace, str(controller.get("name")))
            selected = set(((owner or {}).get("spec") or {}).get("selector", {}).get("matchLabels") or {}) or \
                {"pod-template-hash"}
            held = {k: v for k, v in _labels(pod).items() if k in selected}
            _meta(pod)["labels"] = {k: v for k, v in _labels(pod).items() if k not in selected}
            _meta(pod)["annotations"][ADOPT_LABELS] = json.dumps(held, sort_keys=True)
        if record.get("via") == "kubelet":
            self._checkpoint_images(pod, record, target)
        elif record.get("engine") in INTO_CONTAINER_ENGINES:
            self._hold_for_restore(pod)
        try:
            created: dict[str, Any] = self._call(self.kube.create_pod, namespace, pod)
            return created
        except PermanentExecutorError:
            existing = self._call(self.kube.pod, namespace, new_name)
            if existing is not None and _labels(existing).get(RESTORED_FROM) == checkpoint_id:
                return existing  # a concurrent attempt created it
            raise

    def _hold_for_restore(self, pod: dict[str, Any]) -> None:
        """The replacement's workload container runs a placeholder, so the agent can restore the checkpointed
        tree into it (its root, namespaces and cgroups) and the pod stays up with it: ``gpusweep-run --hold``
        with the original's own wrapper, or the pod's ``gpusweep.io/restore-placeholder``."""
        containers = (pod.get("spec") or {}).get("containers") or []
        wrapped = [c for c in containers if any(Path(str(part)).name == "gpusweep-run"
                                                for part in (c.get("command") or []) + (c.get("args") or []))]
        gpu = [c for c in containers if pod_gpus({"spec": {"containers": [c]}}, GpuResources.of(self.connection))]
        chosen = (wrapped or gpu or containers or [None])[0]
        if chosen is None:
            raise PermanentExecutorError(f"pod {_pod_ref(pod)} has no container to restore into")
        notes = _annotations(pod)
        if notes.get(RESTORE_PLACEHOLDER):
            try:
                placeholder = json.loads(notes[RESTORE_PLACEHOLDER])
            except ValueError:
                placeholder = None
            if not isinstance(placeholder, list) or not placeholder or not all(isinstance(p, str) for p in placeholder):
                raise PermanentExecutorError(f"pod {_pod_ref(pod)}: {RESTORE_PLACEHOLDER} must be a JSON list of "
                                             f"strings, not {notes[RESTORE_PLACEHOLDER]!r}")
        else:
            wrapper = next((str(part) for part in (chosen.get("command") or []) + (chosen.get("args") or [])
                            if Path(str(part)).name == "gpusweep-run"), "")
            if not wrapper:
                raise PermanentExecutorError(
                    f"pod {_pod_ref(pod)}: container {chosen['name']} runs no gpusweep-run, so its replacement has no "
                    f"placeholder to restore the checkpoint into: set {RESTORE_PLACEHOLDER} (a JSON list, a command "
                    "of its image that waits, e.g. [\"gpusweep-run\", \"--hold\"]) or checkpoint it by signal")
            placeholder = [wrapper, "--hold"]
        chosen["command"] = placeholder
        chosen.pop("args", None)
        _meta(pod)["annotations"][RESTORE_INTO] = str(chosen["name"])

    def _restore_into(self, pod: dict[str, Any], container: str, record: dict[str, Any], target: NodeRef,
                      operation_id: str) -> None:
        """Once the replacement's placeholder runs, tell the target's agent to restore the checkpoint into that
        container (its ``containerID``); an operation id of its own, so a retry finds the same restore."""
        status: dict[str, Any] = next((s for s in (pod.get("status") or {}).get("containerStatuses") or []
                       if s.get("name") == container), {})
        if not status.get("containerID") or "running" not in (status.get("state") or {}):
            return
        self.agents.client(self._need_agent(target)).operation(
            "/v1/restore", f"{operation_id}.into"[-128:].lstrip(".-_:"), checkpoint_id=str(record["id"]),
            container_id=str(status["containerID"]))

    def _checkpoint_images(self, pod: dict[str, Any], record: dict[str, Any], target: NodeRef) -> None:
        """The replacement's containers run the checkpoint images: CRI-O and containerd 2.x restore such an image
        (its annotation names the container); any other runtime would start it as an ordinary image, and fail."""
        runtime = str(((self._node(target.name).get("status") or {}).get("nodeInfo") or {}).get(
            "containerRuntimeVersion", ""))
        if not restores_checkpoints(runtime):
            raise PermanentExecutorError(
                f"node {target.name} runs {runtime or 'an unknown runtime'}, which cannot restore a kubelet "
                "checkpoint: only CRI-O and containerd 2.0 or later restore a container from a checkpoint image; "
                "choose such a node, or checkpoint this pod with the agent (criu, cuda, signal)")
        images = record.get("images") or {}
        for container in (pod.get("spec") or {}).get("containers") or []:
            if container["name"] in images:
                container["image"] = str(images[container["name"]])

    def _wait_restored(self, pod: dict[str, Any], record: dict[str, Any], target: NodeRef,
                       operation_id: str = "") -> None:
        """Until the pod runs on `target` with the checkpoint restored in it (``restore_wait_s`` in this call)."""
        namespace, name = _split(_pod_ref(pod))
        checkpoint_id = str(record["id"])
        until = time.monotonic() + self.option("restore_wait_s", 60)
        while True:
            current = self._call(self.kube.pod, namespace, name)
            if current is None:
                raise PermanentExecutorError(f"pod {namespace}/{name} restoring {checkpoint_id} was deleted")
            phase = (current.get("status") or {}).get("phase", "Pending")
            if phase in ("Succeeded", "Failed"):
                raise PermanentExecutorError(f"pod {namespace}/{name} restoring {checkpoint_id} ended: {phase}")
            into = _annotations(current).get(RESTORE_INTO)
            if into and record.get("via") != "kubelet" and (current.get("spec") or {}).get("nodeName") == target.name:
                # Before Ready: the pod's readiness probes may need the workload the restore brings back.
                self._restore_into(current, into, record, target, operation_id or _annotations(current).get(
                    OPERATION, ""))
            restored = _ready(current) and (current.get("spec") or {}).get("nodeName") == target.name
            if restored and record.get("via") == "kubelet":
                restored = self._progress_continued(current, record)
            if restored and record.get("via") != "kubelet":
                state = self.agents.client(self._need_agent(target)).get(f"/v1/checkpoints/{checkpoint_id}")
                taken_by = str((state.get("claimed") or {}).get("by") or "")
                if taken_by and taken_by != target.identity:
                    raise PermanentExecutorError(f"checkpoint {checkpoint_id} was restored by {taken_by}, not by "
                                                 f"{target.identity} for pod {namespace}/{name}")
                restored = (state.get("restored") or {}).get("by") == target.identity
            if restored:
                return
            if time.monotonic() > until:
                raise TemporaryExecutorError(f"pod {namespace}/{name} on {target.name} is {phase}{_waiting(current)}; "
                                             f"checkpoint {checkpoint_id} not restored in it yet")
            time.sleep(self.option("poll_s", 0.5))

    def _hand_over(self, original: dict[str, Any], replacement: dict[str, Any]) -> None:
        """A ReplicaSet adopts the running replacement and finds the original the pod to remove."""
        held = _annotations(replacement).get(ADOPT_LABELS)
        controller = pod_controller(original)
        if not held or controller is None:
            return
        self._call(self.kube.patch_pod, *_split(_pod_ref(original)), {"metadata": {"annotations": {
            DELETION_COST: "-2147483648"}}})
        self._call(self.kube.patch_pod, *_split(_pod_ref(replacement)), {"metadata": {
            "labels": json.loads(held), "annotations": {ADOPT_LABELS: None}, "ownerReferences": [controller]}})

    # -- patch, reboot, verify -------------------------------------------------------
    def patch(self, node: NodeRef, component: str, version: str, operation_id: str,
              packages: dict[str, str] | None = None) -> PatchResult:
        if self.mode == "gpu-operator" and component == "driver":
            return self._operator_upgrade(node, version, operation_id)
        return self.agents.patch(self._need_agent(node), component, version, operation_id, packages)

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        if self.mode == "gpu-operator":
            return  # the operator unloads and reloads the driver's kernel modules: no reboot
        self.agents.reboot(self._need_agent(node), operation_id)

    def verify(self, node: NodeRef) -> VerifyResult:
        obj = self._node(node.name)
        versions, labels, agent = self._observed(node, obj)
        ready = _ready(obj)
        healthy = ready
        output = [f"node {node.name} Ready={ready}", f"GPU feature discovery: {labels}"]
        ref = self._agent(node, obj)
        if ref is not None:
            health = self.agents.client(ref).get("/v1/health")
            healthy = healthy and health.get("status") == "ok"
            output.append(f"agent: {health.get('status')} {agent}")
        if self.mode == "gpu-operator":
            state = _labels(obj).get(UPGRADE_STATE, "")
            healthy = healthy and state in ("", "upgrade-done")
            output.append(f"{UPGRADE_STATE}={state}")
        return VerifyResult(healthy=healthy, versions=versions, output="; ".join(output))

    def health(self, node: NodeRef, expected: dict[str, str], gates: HealthGates,
               operation_id: str) -> HealthResult:
        obj = self._node(node.name)
        ready = HealthCheckResult("node-ready", "passed" if _ready(obj) else "failed",
                                  f"node {node.name} Ready={_ready(obj)}")
        ref = self._agent(node, obj)
        if ref is None:
            return HealthResult((ready, versions_check(expected, self._observed(node, obj)[0])))
        # The operator's containerized driver shows in GPU feature discovery's labels; the agent on the host
        # checks everything else (and its GPUs against the driver it reads itself).
        operated = {k: v for k, v in expected.items() if self.mode == "gpu-operator" and k == "driver"}
        checks = [ready]
        if operated:
            checks.append(replace(versions_check(operated, self._observed(node, obj)[1]), name="operator-driver"))
        from_agent = self.agents.health(replace(ref, gpu_count=ref.gpu_count or node.gpu_count),
                                        {k: v for k, v in expected.items() if k not in operated}, gates, operation_id)
        return HealthResult((*checks, *from_agent.checks))

    def rollback(self, node: NodeRef, operation_id: str) -> RollbackResult:
        if self.mode != "gpu-operator":
            return self.agents.rollback(self._need_agent(node), operation_id)

        def skip(obj: dict[str, Any]) -> dict[str, Any] | None:
            if _labels(obj).get(UPGRADE_SKIP) == "true":
                return None
            return {"metadata": {"labels": {UPGRADE_SKIP: "true"}, "annotations": {SKIP_SET_BY: operation_id}}}

        self._update_node(node.name, skip)
        return RollbackResult(components={}, reboot_required=False, output=(
            f"gpu-operator: nothing reinstalled on {node.name}: the operator never downgrades a node, and its "
            "driver DaemonSet names the new version, so the node keeps the driver the upgrade gave it; it carries "
            f"{UPGRADE_SKIP}=true (set by gpusweep) and stays out of service until someone mends it"))

    # -- the GPU Operator's driver upgrade -------------------------------------------
    def _operator_upgrade(self, node: NodeRef, version: str, operation_id: str) -> PatchResult:
        obj = self._node(node.name)
        record = json.loads(_annotations(obj).get(PATCH_RECORD) or "{}")
        if record.get("op") != operation_id:
            if _labels(obj).get(UPGRADE_STATE) == "upgrade-failed":
                # The state label is the operator's: gpusweep never writes it. The operator retries such a node
                # once its driver pod is healthy again, or when an administrator resets it.
                raise PermanentExecutorError(
                    f"node {node.name}: the GPU Operator failed an earlier driver upgrade of it ({UPGRADE_STATE}="
                    "upgrade-failed); mend its driver pod, or reset its state as NVIDIA's upgrade guide says, then "
                    "sweep it again")
            record = {"op": operation_id, "version": version, "started": _now(),
                      "before": node_from_kubernetes(obj).components.get("driver", "")}
            plural, resource, selector = self._governing(obj)
            self._hold_others(node.name, selector, version, operation_id)
            self._set_operator_version(plural, resource, version)
            self._update_node(node.name, lambda current: self._lift(current, record))
        until = time.monotonic() + self.option("upgrade_wait_s", 60)
        while True:
            labels = _labels(obj)
            state, driver = labels.get(UPGRADE_STATE, ""), node_from_kubernetes(obj).components.get("driver", "")
            if state == "upgrade-done" and driver == version:
                return PatchResult(component="driver", before=str(record["before"]), after=driver,
                                   output=f"GPU Operator: {UPGRADE_STATE}=upgrade-done, driver {driver}")
            if state == "upgrade-failed":
                raise PermanentExecutorError(f"the GPU Operator failed the driver upgrade of {node.name} to {version} "
                                             f"({UPGRADE_STATE}=upgrade-failed)")
            if _now() - float(record["started"]) > self.option("upgrade_timeout_s", 3600):
                raise PermanentExecutorError(f"the GPU Operator's upgrade of {node.name} to {version} is still "
                                             f"{state!r} after {self.option('upgrade_timeout_s', 3600):.0f} s")
            left = until - time.monotonic()
            if left <= 0:
                raise TemporaryExecutorError(f"the GPU Operator is upgrading {node.name} to {version}: "
                                             f"{UPGRADE_STATE}={state or '(none yet)'}")
            for seen in self.kube.watch_node(node.name, _meta(obj)["resourceVersion"], min(left, 10)):
                if _labels(seen).get(UPGRADE_STATE, "") != state:
                    break
            obj = self._node(node.name)

    @staticmethod
    def _lift(obj: dict[str, Any], record: dict[str, Any]) -> dict[str, Any] | None:
        """This node's turn: record the operation and lift gpusweep's skip label."""
        notes, labels = _annotations(obj), _labels(obj)
        if json.loads(notes.get(PATCH_RECORD) or "{}").get("op") == record["op"]:
            return None
        if labels.get(UPGRADE_SKIP) == "true" and SKIP_SET_BY not in notes:
            raise PermanentExecutorError(f"node {_meta(obj)['name']} carries {UPGRADE_SKIP}=true set by someone other "
                                         "than gpusweep; it is not upgraded")
        return {"metadata": {"labels": {UPGRADE_SKIP: None}, "annotations": {
            PATCH_RECORD: json.dumps(record, sort_keys=True), SKIP_SET_BY: None}}}

    def _hold_others(self, this: str, selector: dict[str, str], version: str, operation_id: str) -> None:
        """Every other GPU node the same resource governs (`selector`), not at `version` and not being upgraded
        to it by gpusweep, gets the skip label before the version changes: the operator upgrades only the nodes
        whose work has moved."""
        chosen = ",".join(["nvidia.com/gpu.present=true", *(f"{k}={v}" for k, v in sorted(selector.items()))])
        for other in self._call(self.kube.nodes, chosen):
            name = _meta(other)["name"]
            if name == this:
                continue

            def hold(obj: dict[str, Any]) -> dict[str, Any] | None:
                labels, notes = _labels(obj), _annotations(obj)
                upgrading = json.loads(notes.get(PATCH_RECORD) or "{}").get("version") == version
                if labels.get(UPGRADE_SKIP) == "true" or upgrading or labels.get(UPGRADE_STATE) in UPGRADE_BUSY \
                        or node_from_kubernetes(obj).components.get("driver") == version:
                    return None
                return {"metadata": {"labels": {UPGRADE_SKIP: "true"}, "annotations": {SKIP_SET_BY: operation_id}}}

            self._update_node(name, hold)

    def _governing(self, node: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, str]]:
        """The resource that sets the node's driver version, with the node selector it governs: with the
        ClusterPolicy's ``spec.driver.useNvidiaDriverCRD`` (or no ClusterPolicy) the node's NVIDIADriver (by
        nodeSelector, or the one named in the connection), else the ClusterPolicy itself (the operator then
        ignores NVIDIADrivers). Refused when the policy's ``upgradePolicy.autoUpgrade`` is off: nothing would
        upgrade the node, and waiting for it would only run out ``upgrade_timeout_s``."""
        settings = self.connection.get("gpu_operator") or {}
        name = _meta(node)["name"]
        policy = next((p for p in self._call(self.kube.custom_objects, "nvidia.com", "v1", "clusterpolicies")
                       if not settings.get("cluster_policy") or _meta(p)["name"] == settings["cluster_policy"]), None)
        driver_spec = ((policy or {}).get("spec") or {}).get("driver") or {}
        if (driver_spec.get("upgradePolicy") or {}).get("autoUpgrade") is False:
            raise PermanentExecutorError(
                f"the GPU Operator's driver upgrade controller is off (ClusterPolicy {_meta(policy or {}).get('name')} "
                f"spec.driver.upgradePolicy.autoUpgrade: false): nothing would upgrade {name}; turn it on, or patch "
                "with driver_management: agent")
        if policy is not None and not driver_spec.get("useNvidiaDriverCRD"):
            return "clusterpolicies", policy, {}
        labels = _labels(node)
        for driver in self._call(self.kube.custom_objects, "nvidia.com", "v1alpha1", "nvidiadrivers"):
            selector = {str(k): str(v) for k, v in ((driver.get("spec") or {}).get("nodeSelector") or {}).items()}
            named = settings.get("nvidia_driver")
            if (named and _meta(driver)["name"] == named) or (not named and all(
                    labels.get(k) == v for k, v in selector.items())):
                return "nvidiadrivers", driver, selector
        raise PermanentExecutorError(f"driver_management gpu-operator: no NVIDIADriver selects node {name}"
                                     + (" (the ClusterPolicy sets useNvidiaDriverCRD)" if policy else
                                        " and no ClusterPolicy exists"))

    def _set_operator_version(self, plural: str, resource: dict[str, Any], version: str) -> None:
        """spec.version of an NVIDIADriver, spec.driver.version of a ClusterPolicy."""
        spec = resource.get("spec") or {}
        if plural == "nvidiadrivers" and spec.get("version") != version:
            self._call(self.kube.patch_custom, "nvidia.com", "v1alpha1", plural, _meta(resource)["name"],
                       {"spec": {"version": version}})
        elif plural == "clusterpolicies" and (spec.get("driver") or {}).get("version") != version:
            self._call(self.kube.patch_custom, "nvidia.com", "v1", plural, _meta(resource)["name"],
                       {"spec": {"driver": {"version": version}}})


def _pin(pod: dict[str, Any], node: str) -> None:
    """Require `node`: our term is added to each of the pod's own required terms (terms are ORed)."""
    spec = pod.setdefault("spec", {})
    affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    ours = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchFields"] = [f for f in term.get("matchFields") or [] if f.get("key") != "metadata.name"] + [ours]
    required["nodeSelectorTerms"] = terms
