"""A stateful Kubernetes API server for tests, over TLS on loopback.

No API server can run on these machines (no container runtime, no etcd), so this stands in for
one. It speaks the real wire protocol for what gpusweep and kubectl use, checked against kubectl
1.37 in tests/kube/test_kubectl.py: discovery (``/version``, ``/api``, ``/apis``, the resource
lists with the ``pods/eviction`` and ``nodes/proxy`` subresources), list (paging with
``limit``/``continue``, label and field selectors, server-side printing as ``Table``), get,
create, replace, patch (JSON merge, strategic merge, JSON patch), delete, watch (chunked event
stream from a resource version), ``dryRun=All``, optimistic concurrency on ``resourceVersion``,
the Eviction API with PodDisruptionBudget answers (429), the node proxy (to a kubelet stand-in),
and two custom resources of the GPU Operator: ``ClusterPolicy`` (nvidia.com/v1) and
``NVIDIADriver`` (nvidia.com/v1alpha1). Requests need ``Authorization: Bearer <token>``: the
server's own token is an administrator; ``service_account_token`` issues one bound to a ServiceAccount,
whose requests are authorized by the RBAC objects in the store with the real 403 (tests/kube/rbac.py,
which loads them from deploy/kubernetes). Validation answers as a real server's: 422 on a pod update
changing an immutable field (``spec.nodeName`` among them), 415 on a strategic merge patch of a custom
resource; deletion follows owner references (background, foreground, orphan: ``GarbageCollector``).

PersistentVolumes and StorageClasses (storage.k8s.io/v1) are served as stored, printed as a real server prints
them, and the scheduler places a pod only where its bound volumes' required node affinity (an unbound
WaitForFirstConsumer claim's class ``allowedTopologies``) admits the node, with the real "volume node affinity
conflict" reason.
Controllers run in one background loop (``controllers``): the scheduler in this module, the
kubelets of ``tests/kube/kubelet.py`` and the GPU Operator stand-in of ``tests/kube/gpu_operator.py``.
Everything that happened is in ``history`` (time, what, detail) so a test can check the order.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from tests.kube import rbac
from tests.kube.machinery import (
    ApiError,
    apply_patch,
    field_matcher,
    label_matcher,
    matches_label_selector,
    not_found,
    now,
    table,
)
from tests.kube.pki import server_pki

VERSION = {"major": "1", "minor": "37", "emulationMajor": "1", "emulationMinor": "37",
           "minCompatibilityMajor": "1", "minCompatibilityMinor": "36", "gitVersion": "v1.37.0",
           "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-08-26T00:00:00Z",
           "goVersion": "go1.25.1", "compiler": "gc", "platform": "linux/amd64"}
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    # served from a CustomResourceDefinition: no strategic merge patch (415), as for every custom resource
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
KINDS = [
    Kind("", "v1", "namespaces", "Namespace", False, ("ns",)),
    Kind("", "v1", "nodes", "Node", False, ("no",)),
    Kind("", "v1", "pods", "Pod", True, ("po",), ("all",)),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",)),
    Kind("", "v1", "persistentvolumes", "PersistentVolume", False, ("pv",)),
    Kind("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, ("sc",)),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",)),
    Kind("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), ("all",)),
    Kind("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), ("all",)),
    Kind("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("all",)),
    Kind("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), ("all",)),
    Kind("batch", "v1", "jobs", "Job", True, (), ("all",)),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    Kind("nvidia.com", "v1", "clusterpolicies", "ClusterPolicy", False, custom=True),
    Kind("nvidia.com", "v1alpha1", "nvidiadrivers", "NVIDIADriver", False, ("nvd",), custom=True),
]
BY_PATH = {(k.group, k.version, k.plural): k for k in KINDS}
SUBRESOURCES = {
    ("", "pods"): [{"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                    "version": "v1", "kind": "Eviction", "verbs": ["create"]},
                   {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod",
                    "verbs": ["get", "patch", "update"]}],
    ("", "nodes"): [{"name": "nodes/proxy", "singularName": "", "namespaced": False, "kind": "NodeProxyOptions",
                     "verbs": ["create", "delete", "get", "patch", "update"]},
                    {"name": "nodes/status", "singularName": "", "namespaced": False, "kind": "Node",
                     "verbs": ["get", "patch", "update"]}],
}
POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")
NodeProxy = Callable[[str, str, bytes], tuple[int, Any]]


class Controller(Protocol):
    def tick(self) -> None: ...


def kind_named(plural: str) -> Kind:
    return next(k for k in KINDS if k.plural == plural)


class KubeApiServer:
    """The server and its store. Use as a context manager; ``url``, ``ca_path``, ``token``."""

    def __init__(self, token: str = "test-token", tick_s: float = 0.05) -> None:
        self.token = token
        self.tick_s = tick_s
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.store: dict[Kind, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in KINDS}
        self.rv = 1000
        self.events: list[tuple[int, str, Kind, dict[str, Any], dict[str, Any] | None]] = []
        self.requests: list[str] = []
        # Every write's method, path and body, so a test can say what a client never wrote.
        self.writes: list[tuple[str, str, bytes]] = []
        self.history: list[tuple[float, str, str]] = []
        self.fail_status: int | None = None
        self.node_proxies: dict[str, NodeProxy] = {}
        self.managed_nodes: set[str] = set()  # nodes whose kubelet finalizes pod deletions
        # Who each bearer token is (tests/kube/rbac.py): the server's own token is an administrator.
        self.tokens: dict[str, rbac.User] = {token: rbac.ADMIN}
        # The uids of deleted objects whose dependents the garbage collector has yet to delete.
        self.deleted_owners: set[str] = set()
        self.controllers: list[Controller] = [DaemonSets(self), Scheduler(self), GarbageCollector(self)]
        self._stop = threading.Event()
        for name in ("default", "kube-system"):
            self.put("namespaces", {"metadata": {"name": name}})
        pki = server_pki()
        self.ca_path = pki["ca.pem"]
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(pki["server.pem"]), str(pki["server.key"]))
        context.set_alpn_protocols(["http/1.1"])
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        # The handshake happens in each request's thread, so a slow client never blocks accept().
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self._threads = [threading.Thread(target=self.httpd.serve_forever, daemon=True),
                         threading.Thread(target=self._loop, daemon=True)]

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> KubeApiServer:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self.changed:
            self.changed.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        for controller in self.controllers:
            stop = getattr(controller, "stop", None)
            if stop:
                stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            for controller in list(self.controllers):
                try:
                    controller.tick()
                except Exception as exc:  # noqa: BLE001 - a controller's bug is recorded, the loop goes on
                    self.record("controller-error", f"{type(controller).__name__}: {exc!r}")

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """A kubeconfig for this server: its CA, a bearer token, one context."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(self.ca_path)}}],
            "users": [{"name": "gpusweep", "user": {"token": token or self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "gpusweep"}}],
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token bound to the ServiceAccount `namespace`/`name` (as the kubelet mounts one in a pod):
        its requests are authorized by the RBAC objects in the store."""
        token = f"sa-{namespace}-{name}-{uuid.uuid4().hex}"
        self.tokens[token] = rbac.service_account_user(namespace, name)
        return token

    def authenticate(self, header: str) -> rbac.User:
        # The scheme is case-insensitive, as the API server's bearer authenticator reads it (the
        # official client's in-cluster configuration sends "bearer").
        scheme, _, token = header.partition(" ")
        user = self.tokens.get(token) if scheme.lower() == "bearer" else None
        # A bound token dies with its ServiceAccount.
        if user is None or (user.service_account and self.get("serviceaccounts", user.service_account[1],
                                                               user.service_account[0]) is None):
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def kind_of(self, api_version: str, kind: str) -> Kind | None:
        """The served resource of an ownerReference's apiVersion and kind (its REST mapping)."""
        return next((k for k in KINDS if k.api_version == api_version and k.kind == kind), None)

    def record(self, what: str, detail: str) -> None:
        with self.lock:
            self.history.append((time.time(), what, detail))

    def happened(self, what: str, detail: str | None = None) -> list[tuple[float, str, str]]:
        with self.lock:
            return [h for h in self.history if h[1] == what and (detail is None or h[2] == detail)]

    # -- the store (used by controllers and tests directly, and by the HTTP handler) --
    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, kind: Kind, event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.events.append((self.rv, event, kind, copy.deepcopy(obj), old))
        del self.events[:-20000]
        self.changed.notify_all()

    def put(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would (no admission, no conflict check)."""
        kind = kind_named(plural)
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
            if kind.namespaced:
                meta.setdefault("namespace", "default")
                self._ensure_namespace(meta["namespace"])
            key = (meta.get("namespace", ""), meta["name"])
            old = self.store[kind].get(key)
            meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", (old or {}).get("metadata", {}).get("creationTimestamp") or now())
            meta["resourceVersion"] = self._bump()
            self.store[kind][key] = obj
            self._emit(kind, "MODIFIED" if old else "ADDED", obj, old)
            return copy.deepcopy(obj)

    def _ensure_namespace(self, name: str) -> None:
        ns = kind_named("namespaces")
        if ("", name) not in self.store[ns]:
            obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": name, "uid": str(uuid.uuid4()), "creationTimestamp": now(),
                "labels": {"kubernetes.io/metadata.name": name}}, "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"}}
            obj["metadata"]["resourceVersion"] = self._bump()
            self.store[ns][("", name)] = obj
            self._emit(ns, "ADDED", obj, None)

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        kind = kind_named(plural)
        with self.lock:
            obj = self.store[kind].get((namespace if kind.namespaced else "", name))
            return copy.deepcopy(obj) if obj else None

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        kind = kind_named(plural)
        with self.lock:
            return [copy.deepcopy(o) for (ns, _), o in sorted(self.store[kind].items())
                    if namespace is None or ns == namespace]

    def mutate(self, plural: str, name: str, namespace: str, change: Callable[[dict[str, Any]], None]) -> bool:
        """Change an object in place under the lock (a controller's update); False when it is gone."""
        kind = kind_named(plural)
        with self.lock:
            key = (namespace if kind.namespaced else "", name)
            obj = self.store[kind].get(key)
            if obj is None:
                return False
            old = copy.deepcopy(obj)
            change(obj)
            if obj != old:
                obj["metadata"]["resourceVersion"] = self._bump()
                self._emit(kind, "MODIFIED", obj, old)
            return True

    def remove(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        kind = kind_named(plural)
        with self.lock:
            obj = self.store[kind].pop((namespace if kind.namespaced else "", name), None)
            if obj is not None:
                self.deleted_owners.add(str(obj["metadata"].get("uid", "")))
                self._bump()
                self._emit(kind, "DELETED", obj, obj)
                if plural == "pods":
                    self.record("deleted", f"{namespace}/{name}")
            return obj

    def set_objects(self, plural: str, items: list[dict[str, Any]]) -> None:
        kind = kind_named(plural)
        with self.lock:
            for (ns, name) in list(self.store[kind]):
                self.remove(plural, name, ns)
            for item in items:
                self.put(plural, item)

    # The inventory tests' view: assign lists of nodes and pods.
    @property
    def nodes(self) -> list[dict[str, Any]]:
        return self.objects("nodes")

    @nodes.setter
    def nodes(self, items: list[dict[str, Any]]) -> None:
        self.set_objects("nodes", items)

    @property
    def pods(self) -> list[dict[str, Any]]:
        return self.objects("pods")

    @pods.setter
    def pods(self, items: list[dict[str, Any]]) -> None:
        self.set_objects("pods", items)

    # -- PodDisruptionBudgets and the Eviction API -------------------------------------
    def disruption(self, pod: dict[str, Any]) -> tuple[dict[str, Any] | None, int, int]:
        """The pod's budget (if any), its desired healthy count and the current healthy count."""
        ns = pod["metadata"].get("namespace", "default")
        labels = pod["metadata"].get("labels") or {}
        budgets = [b for b in self.objects("poddisruptionbudgets", ns)
                   if matches_label_selector((b.get("spec") or {}).get("selector"), labels)]
        if len(budgets) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                                                 "eviction subresource does not support.")
        if not budgets:
            return None, 0, 0
        budget = budgets[0]
        spec = budget.get("spec") or {}
        members = [p for p in self.objects("pods", ns)
                   if matches_label_selector(spec.get("selector"), p["metadata"].get("labels") or {})]
        healthy = sum(1 for p in members if is_healthy(p))
        expected = len(members)

        def count(value: Any) -> int:
            text = str(value)
            return -(-int(text[:-1]) * expected // 100) if text.endswith("%") else int(text)

        if "minAvailable" in spec:
            desired = count(spec["minAvailable"])
        elif "maxUnavailable" in spec:
            desired = expected - count(spec["maxUnavailable"])
        else:
            desired = 0
        return budget, desired, healthy

    def evict(self, namespace: str, name: str, dry_run: bool) -> None:
        with self.lock:
            pod = self.get("pods", name, namespace)
            if pod is None:
                raise not_found("pods", name)
            budget, desired, healthy = self.disruption(pod)
            if budget is not None:
                always = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                allowed = (healthy - desired >= 1) if is_healthy(pod) else (always or healthy >= desired)
                if not allowed:
                    self.record("eviction-refused", f"{namespace}/{name}")
                    raise ApiError(429, "TooManyRequests",
                                   "Cannot evict pod as it would violate the pod's disruption budget.",
                                   {"causes": [{"reason": "DisruptionBudget", "message":
                                                f"The disruption budget {budget['metadata']['name']} needs "
                                                f"{desired} healthy pods and has {healthy} currently"}]})
            if dry_run:
                return
            self.record("evicted", f"{namespace}/{name}")
            self.delete_pod(namespace, name)

    def delete_pod(self, namespace: str, name: str, grace: int = 30) -> dict[str, Any] | None:
        """Graceful deletion: a kubelet stops the containers and removes the pod; without one it goes now."""
        pod = self.get("pods", name, namespace)
        if pod is None:
            return None
        if (pod.get("spec") or {}).get("nodeName") in self.managed_nodes:
            def mark(obj: dict[str, Any]) -> None:
                obj["metadata"].setdefault("deletionTimestamp", now())
                obj["metadata"].setdefault("deletionGracePeriodSeconds", grace)
            self.mutate("pods", name, namespace, mark)
            return self.get("pods", name, namespace)
        return self.remove("pods", name, namespace)


def single_node_claims(api: KubeApiServer, pod: dict[str, Any]) -> list[str]:
    """The pod's claims whose volume attaches to one node at a time (ReadWriteOnce, ReadWriteOncePod)."""
    namespace = pod["metadata"].get("namespace", "default")
    names = [v["persistentVolumeClaim"]["claimName"] for v in (pod.get("spec") or {}).get("volumes") or []
             if v.get("persistentVolumeClaim")]
    return [n for n in names if {"ReadWriteOnce", "ReadWriteOncePod"} & set(
        ((api.get("persistentvolumeclaims", n, namespace) or {}).get("spec") or {}).get("accessModes") or [])]


def is_healthy(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return status.get("phase") == "Running" and ready and not pod["metadata"].get("deletionTimestamp")


# -- the scheduler -----------------------------------------------------------------------
def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def taints_tolerated(node: dict[str, Any], tolerations: list[dict[str, Any]], effects: tuple[str, ...]) -> str:
    """"" when every taint of `node` with one of `effects` is tolerated, else the first that is not."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in effects and not _tolerated(taint, tolerations):
            return f"{taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
    return ""


def _term_matches(term: dict[str, Any], node: dict[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    for expr in term.get("matchExpressions") or []:
        if not matches_label_selector({"matchExpressions": [expr]}, labels):
            return False
    for expr in term.get("matchFields") or []:
        fields = {"metadata.name": node["metadata"]["name"]}
        if not matches_label_selector({"matchExpressions": [expr]}, fields):
            return False
    return True


def gpu_request(pod: dict[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        total += int((resources.get("limits") or {}).get("nvidia.com/gpu")
                     or (resources.get("requests") or {}).get("nvidia.com/gpu") or 0)
    return total


# -- the DaemonSet controller ---------------------------------------------------------------
# What the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util
# AddOrUpdateDaemonPodTolerations): it keeps running through node trouble and a cordon.
DAEMON_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def controller_uid(obj: dict[str, Any]) -> str:
    owner = next((o for o in obj["metadata"].get("ownerReferences") or [] if o.get("controller")), {})
    return str(owner.get("uid", ""))


class DaemonSets:
    """One pod per eligible node for each DaemonSet, as the DaemonSet controller runs them: a node is
    eligible when the template's nodeSelector and required node affinity match it and every NoSchedule
    or NoExecute taint on it is tolerated (the template's tolerations plus ``DAEMON_TOLERATIONS``). A
    pod already on a node whose new taint is only NoSchedule keeps running; a deleted one comes back only
    where the node is still eligible (the driver pod the GPU Operator deletes at pod-restart-required).
    Each pod is pinned to its node by a required ``metadata.name`` affinity and bound by the scheduler."""

    def __init__(self, api: KubeApiServer) -> None:
        self.api = api

    def tick(self) -> None:
        with self.api.lock:
            sets = self.api.objects("daemonsets")
            if not sets:
                return
            nodes, pods = self.api.objects("nodes"), self.api.objects("pods")
            for ds in sets:
                self._sync(ds, nodes, [p for p in pods if controller_uid(p) == ds["metadata"]["uid"]])

    def _sync(self, ds: dict[str, Any], nodes: list[dict[str, Any]], owned: list[dict[str, Any]]) -> None:
        template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
        spec = template.setdefault("spec", {})
        spec["tolerations"] = [*(spec.get("tolerations") or []),
                               *(t for t in DAEMON_TOLERATIONS if t not in (spec.get("tolerations") or []))]
        for node in nodes:
            name = node["metadata"]["name"]
            here = [p for p in owned if _pinned_to(p) == name]
            runs = self.eligible(spec, node, ("NoSchedule", "NoExecute"))
            if not runs and here and not self.eligible(spec, node, ("NoExecute",)):
                for pod in here:  # an untolerated NoExecute taint or a selector that no longer matches
                    self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
            if runs and not here:
                self._create(ds, template, name)

    @staticmethod
    def eligible(spec: dict[str, Any], node: dict[str, Any], effects: tuple[str, ...]) -> bool:
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return False
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
        if terms and not any(_term_matches(t, node) for t in terms):
            return False
        return not taints_tolerated(node, spec.get("tolerations") or [], effects)

    def _create(self, ds: dict[str, Any], template: dict[str, Any], node: str) -> None:
        meta = ds["metadata"]
        pod = copy.deepcopy(template)
        pod_meta = pod.setdefault("metadata", {})
        pod_meta.update(name=f"{meta['name']}-{uuid.uuid4().hex[:5]}", namespace=meta.get("namespace", "default"),
                        ownerReferences=[{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"],
                                          "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}])
        pod_meta.setdefault("labels", {})["controller-revision-hash"] = template_hash(template)
        pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}
        pod["status"] = {"phase": "Pending"}
        self.api.put("pods", pod)
        self.api.record("daemon-pod-created", f"{pod_meta['namespace']}/{meta['name']} {node}")


def template_hash(template: dict[str, Any]) -> str:
    """The label a daemon pod carries of the template it was made from (its ControllerRevision)."""
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k not in ("tolerations", "affinity")}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def _pinned_to(pod: dict[str, Any]) -> str:
    """The node a daemon pod is bound or pinned to."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return next((str(e["values"][0]) for t in terms for e in t.get("matchFields") or []
                 if e.get("key") == "metadata.name" and e.get("values")), "")


FOREGROUND = "foregroundDeletion"


class GarbageCollector:
    """Owner references as the garbage collector follows them. Background propagation (the default): once
    an owner is gone from the store, each object whose ownerReferences name it (by uid) is deleted when no
    other owner of it remains, or loses that reference otherwise; a pod goes through graceful deletion (its
    kubelet stops it first), and a deleted dependent's own dependents follow on a later pass. Foreground: an
    owner marked with the ``foregroundDeletion`` finalizer is removed once its dependents are gone. Orphan
    is done at the owner's deletion (the handler strips the references). Unlike the real collector it acts
    only on owners it saw deleted: a dependent whose owner never existed here is left alone (tests make pods
    for owners they do not model), where the real one would delete it on finding the owner absent."""

    def __init__(self, api: KubeApiServer) -> None:
        self.api = api

    def dependents(self, uid: str) -> list[tuple[Kind, dict[str, Any]]]:
        return [(kind, obj) for kind in KINDS for obj in self.api.store[kind].values()
                if any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])]

    def collect(self, kind: Kind, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if kind.plural == "pods":
            self.api.delete_pod(meta.get("namespace", ""), meta["name"])
        else:
            self.api.remove(kind.plural, meta["name"], meta.get("namespace", ""))
        self.api.record("garbage-collected", f"{kind.plural} {meta.get('namespace', '')}/{meta['name']}")

    def tick(self) -> None:
        with self.api.lock:
            for kind in KINDS:
                for obj in [o for o in self.api.store[kind].values()
                            if FOREGROUND in (o["metadata"].get("finalizers") or [])]:
                    waiting = self.dependents(obj["metadata"]["uid"])
                    for dep_kind, dependent in waiting:
                        if not dependent["metadata"].get("deletionTimestamp"):
                            self.collect(dep_kind, dependent)
                    if not self.dependents(obj["metadata"]["uid"]):
                        self.api.remove(kind.plural, obj["metadata"]["name"], obj["metadata"].get("namespace", ""))
            if not self.api.deleted_owners:
                return
            live = {o["metadata"].get("uid") for kind in KINDS for o in self.api.store[kind].values()}
            gone, self.api.deleted_owners = self.api.deleted_owners - live, set()
            for kind in KINDS:
                for obj in list(self.api.store[kind].values()):
                    refs = obj["metadata"].get("ownerReferences") or []
                    if not any(r.get("uid") in gone for r in refs):
                        continue
                    rest = [r for r in refs if r.get("uid") not in gone]
                    if rest:
                        meta = obj["metadata"]
                        self.api.mutate(kind.plural, meta["name"], meta.get("namespace", ""),
                                        lambda o, kept=rest: o["metadata"].update(ownerReferences=kept))
                    elif not obj["metadata"].get("deletionTimestamp"):
                        self.collect(kind, obj)

    def orphan(self, uid: str) -> None:
        """Orphan propagation: the dependents lose their references to `uid` and stay."""
        for kind, obj in self.dependents(uid):
            meta = obj["metadata"]

            def drop(o: dict[str, Any]) -> None:
                kept = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
                if kept:
                    o["metadata"]["ownerReferences"] = kept
                else:
                    o["metadata"].pop("ownerReferences", None)
            self.api.mutate(kind.plural, meta["name"], meta.get("namespace", ""), drop)


class Scheduler:
    """Binds pending pods to a node that admits them: schedulable, taints tolerated, nodeSelector and
    required node affinity met, and enough free ``nvidia.com/gpu``."""

    def __init__(self, api: KubeApiServer) -> None:
        self.api = api

    def fits(self, pod: dict[str, Any], node: dict[str, Any], pods: list[dict[str, Any]]) -> str:
        spec = pod.get("spec") or {}
        # The NodeUnschedulable plugin: a cordon keeps out every pod but those tolerating its taint
        # (a DaemonSet's pods get that toleration from their controller).
        if (node.get("spec") or {}).get("unschedulable") and not _tolerated(UNSCHEDULABLE, spec.get("tolerations")
                                                                             or []):
            return "node(s) were unschedulable"
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
                    taint, spec.get("tolerations") or []):
                return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
        labels = node["metadata"].get("labels") or {}
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}
        terms = required.get("nodeSelectorTerms") or []
        if terms and not any(_term_matches(t, node) for t in terms):
            return "node(s) didn't match Pod's node affinity/selector"
        if not self.volumes_attach(pod, node):
            return "node(s) had volume node affinity conflict"
        capacity = int(((node.get("status") or {}).get("allocatable") or (node.get("status") or {}).get(
            "capacity") or {}).get("nvidia.com/gpu") or 0)
        used = sum(gpu_request(p) for p in pods if (p.get("spec") or {}).get("nodeName") == node["metadata"]["name"]
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
        if gpu_request(pod) > capacity - used:
            return "Insufficient nvidia.com/gpu"
        return ""

    def volumes_attach(self, pod: dict[str, Any], node: dict[str, Any]) -> bool:
        """The VolumeBinding plugin: each bound claim's PersistentVolume's required node affinity admits the
        node; an unbound claim of a WaitForFirstConsumer StorageClass needs the node within its
        allowedTopologies (the volume is provisioned there)."""
        namespace = pod["metadata"].get("namespace", "default")
        labels = node["metadata"].get("labels") or {}
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            name = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            claim = self.api.get("persistentvolumeclaims", name, namespace) if name else None
            spec = (claim or {}).get("spec") or {}
            if spec.get("volumeName"):
                bound = self.api.get("persistentvolumes", spec["volumeName"]) or {}
                terms = ((((bound.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
                    "nodeSelectorTerms") or [])
                if terms and not any(_term_matches(t, node) for t in terms):
                    return False
            elif spec.get("storageClassName"):
                storage = self.api.get("storageclasses", spec["storageClassName"]) or {}
                allowed = storage.get("allowedTopologies") or []
                if storage.get("volumeBindingMode") == "WaitForFirstConsumer" and allowed and not any(
                        all(labels.get(e["key"]) in (e.get("values") or []) for e in t.get("matchLabelExpressions")
                            or []) for t in allowed):
                    return False
        return True

    def tick(self) -> None:
        with self.api.lock:
            pods = self.api.objects("pods")
            pending = [p for p in pods if not (p.get("spec") or {}).get("nodeName")
                       and not p["metadata"].get("deletionTimestamp")]
            if not pending:
                return
            nodes = self.api.objects("nodes")
            for pod in pending:
                reasons = {}
                chosen = None
                for node in nodes:
                    why = self.fits(pod, node, pods)
                    if not why:
                        chosen = node["metadata"]["name"]
                        break
                    reasons[why] = reasons.get(why, 0) + 1
                meta = pod["metadata"]
                if chosen:
                    def bind(obj: dict[str, Any], node_name: str = chosen) -> None:
                        obj["spec"]["nodeName"] = node_name
                        _set_condition(obj, "PodScheduled", "True")
                    self.api.mutate("pods", meta["name"], meta["namespace"], bind)
                    self.api.record("scheduled", f"{meta['namespace']}/{meta['name']} {chosen}")
                    pod["spec"]["nodeName"] = chosen
                else:
                    message = f"0/{len(nodes)} nodes are available: " + ", ".join(
                        f"{n} {why}" for why, n in sorted(reasons.items())) + "."

                    def unschedulable(obj: dict[str, Any], text: str = message) -> None:
                        obj.setdefault("status", {})["phase"] = "Pending"
                        _set_condition(obj, "PodScheduled", "False", "Unschedulable", text)
                    self.api.mutate("pods", meta["name"], meta["namespace"], unschedulable)


def _set_condition(pod: dict[str, Any], kind: str, status: str, reason: str = "", message: str = "") -> None:
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    current = next((c for c in conditions if c.get("type") == kind), None)
    entry = {"type": kind, "status": status, "lastTransitionTime": now(),
             **({"reason": reason} if reason else {}), **({"message": message} if message else {})}
    if current is None:
        conditions.append(entry)
    elif current.get("status") != status or current.get("message", "") != message:
        current.update(entry)


set_condition = _set_condition


# -- HTTP --------------------------------------------------------------------------------
def _validate(kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    meta = obj.get("metadata") or {}
    problems = []
    name = str(meta.get("name") or "")
    if not name or len(name) > 253 or not DNS_SUBDOMAIN_RE.match(name):
        problems.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of "
                        "lower case alphanumeric characters, '-' or '.'")
    for key, value in (meta.get("labels") or {}).items():
        base = key.rsplit("/", 1)[-1]
        if len(base) > 63 or not LABEL_NAME_RE.match(base):
            problems.append(f"metadata.labels: Invalid value: {key!r}: name part must be 63 characters or less")
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE_RE.match(value):
            problems.append(f"metadata.labels: Invalid value: {value!r}: a valid label must be an empty string or "
                            "consist of alphanumeric characters, '-', '_' or '.', 63 characters or less")
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            problems.append(f"metadata.annotations: Invalid value: {key!r}: must be a string")
    if kind.plural == "pods":
        containers = (obj.get("spec") or {}).get("containers") or []
        if not containers:
            problems.append("spec.containers: Required value")
        if old is None and (obj.get("spec") or {}).get("ephemeralContainers"):
            problems.append("spec.ephemeralContainers: Forbidden: cannot be set on create")
        if old is not None:
            def fixed(spec: dict[str, Any]) -> dict[str, Any]:
                out = {k: v for k, v in spec.items() if k not in POD_MUTABLE_SPEC}
                out["containers"] = [{k: v for k, v in c.items() if k != "image"} for c in out.get("containers") or []]
                return out
            if fixed(obj.get("spec") or {}) != fixed(old.get("spec") or {}):
                problems.append("spec: Forbidden: pod updates may not change fields other than `spec.containers[*]"
                                ".image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
                                "existing tolerations), `spec.terminationGracePeriodSeconds`")
    if problems:
        raise ApiError(422, "Invalid", f'{kind.kind} "{name}" is invalid: ' + "; ".join(problems),
                       {"name": name, "group": kind.group, "kind": kind.kind, "causes": [_cause(p) for p in problems]})


def _cause(problem: str) -> dict[str, str]:
    """A field.Error as a StatusCause: "spec: Forbidden: ..." is field spec, reason FieldValueForbidden."""
    field, _, message = problem.partition(": ")
    reasons = {"Forbidden": "FieldValueForbidden", "Required value": "FieldValueRequired",
               "Unsupported value": "FieldValueNotSupported"}
    reason = next((r for prefix, r in reasons.items() if message.startswith(prefix)), "FieldValueInvalid")
    return {"reason": reason, "message": message, "field": field}


def _handler(api: KubeApiServer) -> type[BaseHTTPRequestHandler]:
    collector = next(c for c in api.controllers if isinstance(c, GarbageCollector))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        user: rbac.User
        request: rbac.Request

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            api.requests.append(self.path if method == "GET" else f"{method} {self.path}")
            if method != "GET":
                api.writes.append((method, self.path, body))
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            path = unquote(url.path).rstrip("/") or "/"
            try:
                if api.fail_status:
                    raise ApiError(api.fail_status, "InternalError", "injected failure")
                if path in ("/healthz", "/livez", "/readyz"):
                    return self._raw(200, b"ok", "text/plain")
                if path == "/version":
                    return self._send(200, VERSION)
                self.user = api.authenticate(self.headers.get("Authorization") or "")
                self._route(method, path, query, body)
            except ApiError as exc:
                self._send(exc.code, exc.status(), exc.headers)
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                pass

        # -- responses -----------------------------------------------------------------
        def _raw(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Audit-Id", str(uuid.uuid4()))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            self._raw(status, json.dumps(body).encode(), "application/json", headers)

        # -- routing -------------------------------------------------------------------
        def _route(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
            parts = path.strip("/").split("/")
            if path == "/api":
                return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": api.url.removeprefix("https://")}]})
            if path == "/apis":
                return self._send(200, _group_list())
            if parts[0] == "api" and len(parts) == 2:
                return self._send(200, _resource_list("", parts[1]))
            if parts[0] == "apis" and len(parts) == 2:
                group = next((g for g in _group_list()["groups"] if g["name"] == parts[1]), None)
                if group is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return self._send(200, {"kind": "APIGroup", "apiVersion": "v1", **group})
            if parts[0] == "apis" and len(parts) == 3:
                return self._send(200, _resource_list(parts[1], parts[2]))
            if parts[0] == "api":
                group, version, rest = "", parts[1], parts[2:]
            elif parts[0] == "apis" and len(parts) > 3:
                group, version, rest = parts[1], parts[2], parts[3:]
            else:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            namespace = ""
            if len(rest) >= 3 and rest[0] == "namespaces" and (group, version, rest[2]) in BY_PATH:
                namespace, rest = rest[1], rest[2:]
            kind = BY_PATH.get((group, version, rest[0]))
            name = rest[1] if len(rest) > 1 else ""
            sub = rest[2] if len(rest) > 2 else ""
            # Authorization comes before the resource is looked up, as in the real filter chain.
            self.request = rbac.Request(rbac.verb_of(method, name, query.get("watch") in ("1", "true")), group,
                                        rest[0], sub, name, namespace)
            rbac.authorize(api, self.user, self.request)
            if kind is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if kind.plural == "nodes" and sub == "proxy":
                return self._proxy(method, name.split(":")[0], "/" + "/".join(rest[3:]), body)
            if kind.plural == "pods" and sub == "eviction" and method == "POST":
                return self._evict(namespace, name, query, body)
            if kind.plural == "pods" and sub == "log" and method == "GET":
                return self._pod_log(namespace, name, query)
            if sub and sub != "status":
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if not name:
                if method == "GET":
                    return self._watch(kind, namespace, query) if query.get("watch") in ("1", "true") \
                        else self._list(kind, namespace, query)
                if method == "POST":
                    return self._create(kind, namespace, query, body)
                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
            if method == "GET":
                obj = api.get(kind.plural, name, namespace)
                if obj is None:
                    raise not_found(kind.plural, name, kind.group)
                if "as=Table" in (self.headers.get("Accept") or ""):
                    return self._send(200, table(kind.plural, [obj], {"resourceVersion": str(api.rv)}))
                return self._send(200, obj)
            if method in ("PUT", "PATCH"):
                return self._update(kind, namespace, name, method, query, body)
            if method == "DELETE":
                return self._delete(kind, namespace, name, query, body)
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed")

        def _list(self, kind: Kind, namespace: str, query: dict[str, str]) -> None:
            labels = label_matcher(query.get("labelSelector", ""))
            fields = field_matcher(query.get("fieldSelector", ""))
            with api.lock:
                items = [o for o in api.objects(kind.plural, namespace or None)
                         if labels(o["metadata"].get("labels")) and fields(o)]
                rv = str(api.rv)
            start = int(query.get("continue") or 0)
            limit = int(query.get("limit") or 0) or len(items) or 1
            page = items[start:start + limit]
            meta = {"resourceVersion": rv, **({"continue": str(start + limit)} if start + limit < len(items) else {})}
            if "as=Table" in (self.headers.get("Accept") or ""):
                return self._send(200, table(kind.plural, page, meta))
            self._send(200, {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "metadata": meta,
                             "items": page})

        def _watch(self, kind: Kind, namespace: str, query: dict[str, str]) -> None:
            labels = label_matcher(query.get("labelSelector", ""))
            fields = field_matcher(query.get("fieldSelector", ""))
            deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)

            def wanted(obj: dict[str, Any] | None) -> bool:
                return bool(obj) and (not namespace or obj["metadata"].get("namespace") == namespace) \
                    and labels(obj["metadata"].get("labels")) and fields(obj)  # type: ignore[index]

            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with api.lock:
                since = query.get("resourceVersion", "")
                pending: list[dict[str, Any]] = []
                initial = query.get("sendInitialEvents") == "true"
                if since in ("", "0") or initial:
                    pending = [{"type": "ADDED", "object": o} for o in api.objects(kind.plural, namespace or None)
                               if wanted(o)]
                    cursor = api.rv
                    if initial:
                        # A streaming list (WatchList) ends its initial events with this bookmark.
                        pending.append({"type": "BOOKMARK", "object": {
                            "kind": kind.kind, "apiVersion": kind.api_version, "metadata": {
                                "resourceVersion": str(cursor), "annotations": {"k8s.io/initial-events-end": "true"}}}})
                else:
                    cursor = int(since)
                    if api.events and api.events[0][0] > cursor + 1:
                        pending = [{"type": "ERROR", "object": ApiError(
                            410, "Expired", f"too old resource version: {since}").status()}]
            try:
                while True:
                    for event in pending:
                        self._chunk(json.dumps(event).encode() + b"\n")
                    if any(e["type"] == "ERROR" for e in pending):
                        break
                    with api.changed:
                        fresh = [e for e in api.events if e[0] > cursor and e[2] == kind]
                        while not fresh and time.monotonic() < deadline and not api._stop.is_set():
                            api.changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                            fresh = [e for e in api.events if e[0] > cursor and e[2] == kind]
                        if api.events:
                            cursor = max(cursor, api.events[-1][0])
                    if not fresh:
                        break
                    pending = []
                    for _rv, event, _kind, obj, old in fresh:
                        now_in, was_in = wanted(obj) and event != "DELETED", wanted(old)
                        if now_in:
                            pending.append({"type": "MODIFIED" if was_in and event != "ADDED" else "ADDED",
                                            "object": obj})
                        elif was_in:
                            pending.append({"type": "DELETED", "object": obj})
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                pass

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _decode(self, body: bytes) -> dict[str, Any]:
            try:
                obj = json.loads(body or b"null")
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise ApiError(400, "BadRequest", "the body is not an object")
            return obj

        def _create(self, kind: Kind, namespace: str, query: dict[str, str], body: bytes) -> None:
            obj = self._decode(body)
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            if kind.namespaced:
                meta["namespace"] = namespace or meta.get("namespace") or "default"
                if api.get("namespaces", meta["namespace"]) is None:
                    raise not_found("namespaces", meta["namespace"])
            _validate(kind, obj, None)
            rbac.admit_owner_references(api, self.user, self.request, obj, None)
            with api.lock:
                if api.get(kind.plural, meta["name"], meta.get("namespace", "")) is not None:
                    raise ApiError(409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" already exists',
                                   {"name": meta["name"], "group": kind.group, "kind": kind.plural})
                for key in ("resourceVersion", "uid", "creationTimestamp", "deletionTimestamp"):
                    meta.pop(key, None)
                if kind.plural == "pods":
                    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
                if query.get("dryRun") == "All":
                    return self._send(201, obj)
                created = api.put(kind.plural, obj)
            api.record("created", f"{meta.get('namespace', '')}/{meta['name']}" if kind.namespaced else meta["name"])
            self._send(201, created)

        def _update(self, kind: Kind, namespace: str, name: str, method: str, query: dict[str, str],
                    body: bytes) -> None:
            with api.lock:
                old = api.get(kind.plural, name, namespace)
                if old is None:
                    raise not_found(kind.plural, name, kind.group)
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                if method == "PUT":
                    new = self._decode(body)
                elif kind.custom and content_type == "application/strategic-merge-patch+json":
                    # A custom resource has no Go type to carry patch strategies: the CRD handler refuses it.
                    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                                   "accepted media types include: application/json-patch+json, "
                                   "application/merge-patch+json, application/apply-patch+yaml")
                else:
                    new = apply_patch(old, content_type, body)
                wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
                if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} "{name}": the '
                                   "object has been modified; please apply your changes to the latest version "
                                   "and try again", {"name": name, "group": kind.group, "kind": kind.plural})
                new.setdefault("metadata", {})
                for key in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
                    if key in old["metadata"]:
                        new["metadata"][key] = old["metadata"][key]
                if kind.plural in ("pods", "nodes") and "status" not in new:
                    new["status"] = old.get("status", {})
                _validate(kind, new, old)
                rbac.admit_owner_references(api, self.user, self.request, new, old)
                if query.get("dryRun") == "All":
                    return self._send(200, new)
                new["metadata"].pop("resourceVersion", None)
                updated = api.put(kind.plural, new)
            self._send(200, updated)

        def _delete(self, kind: Kind, namespace: str, name: str, query: dict[str, str], body: bytes) -> None:
            options = self._decode(body) if body else {}
            policy = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            if policy not in ("Background", "Foreground", "Orphan"):
                raise ApiError(422, "Invalid", f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: '
                               f'Unsupported value: "{policy}": supported values: "Foreground", "Background", '
                               '"Orphan", "nil"')
            with api.lock:
                obj = api.get(kind.plural, name, namespace)
                if obj is None:
                    raise not_found(kind.plural, name, kind.group)
                if query.get("dryRun") == "All" or "All" in (options.get("dryRun") or []):
                    return self._send(200, obj)
                uid = obj["metadata"]["uid"]
                if policy == "Orphan":
                    collector.orphan(uid)
                if policy == "Foreground" and collector.dependents(uid):
                    def mark(o: dict[str, Any]) -> None:
                        o["metadata"].setdefault("deletionTimestamp", now())
                        o["metadata"]["finalizers"] = [*(o["metadata"].get("finalizers") or []), FOREGROUND]
                    api.mutate(kind.plural, name, namespace, mark)
                    return self._send(200, api.get(kind.plural, name, namespace))
                gone = api.delete_pod(namespace, name) if kind.plural == "pods" else api.remove(
                    kind.plural, name, namespace)
            self._send(200, gone or obj)

        def _evict(self, namespace: str, name: str, query: dict[str, str], body: bytes) -> None:
            eviction = self._decode(body)
            options = eviction.get("deleteOptions") or {}
            dry_run = query.get("dryRun") == "All" or "All" in (options.get("dryRun") or [])
            api.evict(namespace, name, dry_run)
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

        def _pod_log(self, namespace: str, name: str, query: dict[str, str]) -> None:
            """``pods/log``: as the real server, asked of the kubelet of the pod's node (its containerLogs)."""
            pod = api.get("pods", name, namespace)
            if pod is None:
                raise not_found("pods", name)
            node = (pod.get("spec") or {}).get("nodeName") or ""
            target = api.node_proxies.get(node)
            if target is None:
                raise ApiError(400, "BadRequest", f"pod {name} has no running kubelet to ask for its log")
            container = query.get("container") or ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name")
            tail = f"?tailLines={query['tailLines']}" if query.get("tailLines") else ""
            status, answer = target("GET", f"/containerLogs/{namespace}/{name}/{container}{tail}", b"")
            if status != 200:
                raise ApiError(status, "BadRequest", str(answer))
            self._raw(200, answer.encode() if isinstance(answer, str) else bytes(answer), "text/plain")

        def _proxy(self, method: str, node: str, path: str, body: bytes) -> None:
            if api.get("nodes", node) is None:
                raise not_found("nodes", node)
            target = api.node_proxies.get(node)
            if target is None:
                raise ApiError(503, "ServiceUnavailable", f"no kubelet answers for node {node}")
            api.record("proxied", f"{method} {node} {path}")
            status, answer = target(method, path, body)
            if isinstance(answer, (bytes, str)):
                data = answer.encode() if isinstance(answer, str) else answer
                return self._raw(status, data, "text/plain; charset=utf-8")
            self._send(status, answer)

    return Handler


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for kind in KINDS:
        if kind.group and kind.version not in groups.setdefault(kind.group, []):
            groups[kind.group].append(kind.version)
    return groups


def _group_list() -> dict[str, Any]:
    out = []
    for name, versions in _groups().items():
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        out.append({"name": name, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": out}


def _resource_list(group: str, version: str) -> dict[str, Any]:
    kinds = [k for k in KINDS if k.group == group and k.version == version]
    if not kinds:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    resources: list[dict[str, Any]] = []
    for kind in kinds:
        entry: dict[str, Any] = {"name": kind.plural, "singularName": kind.singular, "namespaced": kind.namespaced,
                                 "kind": kind.kind, "verbs": VERBS}
        if kind.short:
            entry["shortNames"] = list(kind.short)
        if kind.categories:
            entry["categories"] = list(kind.categories)
        resources.append(entry)
        resources.extend(SUBRESOURCES.get((group, kind.plural), []))
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}
