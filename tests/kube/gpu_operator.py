"""A stand-in for the NVIDIA GPU Operator's driver upgrade controller (k8s-operator-libs' upgrade
state machine), so the gpu-operator driver management can be tested without a GPU or a cluster.

What it keeps from the real controller (NVIDIA's "GPU Driver Upgrades" page and
NVIDIA/k8s-operator-libs ``pkg/upgrade``): the wanted version is ``spec.version`` of the
``NVIDIADriver`` whose ``nodeSelector`` matches the node when the ClusterPolicy sets
``spec.driver.useNvidiaDriverCRD`` (or there is none), else ``spec.driver.version`` of the
``ClusterPolicy``; with ``upgradePolicy.autoUpgrade: false`` no node's state moves;
each GPU node (``nvidia.com/gpu.present=true``) carries its state in the label
``nvidia.com/gpu-driver-upgrade-state``: upgrade-required, cordon-required,
wait-for-jobs-required, pod-deletion-required, (drain-required when drain is enabled),
pod-restart-required, validation-required, uncordon-required, upgrade-done, or upgrade-failed. A
node labelled ``nvidia.com/gpu-driver-upgrade.skip=true`` parks in upgrade-required until the label
is lifted. At most ``spec.driver.upgradePolicy.maxParallelUpgrades`` nodes are between cordon and
uncordon at once. A node already unschedulable when its upgrade starts gets the annotation
``nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable`` and is left cordoned at the end.
Pod deletion deletes the node's GPU pods. A node in ``fail_nodes`` ends upgrade-failed.

Its operands are DaemonSets in namespace ``gpu-operator``, run by the test API server's DaemonSet
controller: the driver (``nvidia-driver-daemonset`` from the ClusterPolicy, or one
``nvidia-gpu-driver-<name>`` per NVIDIADriver with its nodeSelector; update strategy OnDelete, its
image tagged with the wanted version), the device plugin and the validator, each with the chart's
default tolerations (``CHART_TOLERATIONS``). At pod-restart-required the controller deletes the
node's driver pod when it is not of the wanted version and waits for the DaemonSet's new one to be
Ready there, then sets the node's driver labels (as GPU feature discovery would); at
validation-required it waits for the node's validator pod to be Ready. A node whose taints the
operands do not tolerate gets no new driver pod, so its upgrade stays at pod-restart-required.
"""

from __future__ import annotations

from typing import Any

from tests.kube.apiserver import KubeApiServer, controller_uid, gpu_request, is_healthy
from tests.kube.machinery import matches_label_selector

STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
INITIAL = "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
NAMESPACE = "gpu-operator"
# The GPU Operator chart's default tolerations for every operand DaemonSet (driver, device plugin,
# validator, GFD, DCGM exporter ...): `daemonsets.tolerations` in NVIDIA/gpu-operator
# deployments/gpu-operator/values.yaml (v24.x: one entry, key nvidia.com/gpu, Exists, NoSchedule;
# the same file notes that the driver DaemonSet always updates OnDelete).
CHART_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
DRIVER_IMAGE = "nvcr.io/nvidia/driver"
IN_PROGRESS = ("cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
               "pod-restart-required", "validation-required", "uncordon-required")


def driver_of(node: dict[str, Any]) -> str:
    labels = node["metadata"].get("labels") or {}
    if labels.get("nvidia.com/cuda.driver-version.full"):
        return labels["nvidia.com/cuda.driver-version.full"]
    parts = [labels.get(f"nvidia.com/cuda.driver.{p}", "") for p in ("major", "minor", "rev")]
    return ".".join(p for p in parts if p)


def set_driver(labels: dict[str, str], version: str) -> None:
    major, minor, *rest = version.split(".")
    labels.update({"nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": minor,
                   "nvidia.com/cuda.driver.rev": rest[0] if rest else ""})
    if "nvidia.com/cuda.driver-version.full" in labels:
        labels["nvidia.com/cuda.driver-version.full"] = version


class GpuOperator:
    def __init__(self, api: KubeApiServer, fail_nodes: set[str] | None = None) -> None:
        self.api = api
        self.fail_nodes = set(fail_nodes or ())
        # (node, state) in the order the controller moved them, and the most nodes upgrading at once.
        self.transitions: list[tuple[str, str]] = []
        self.max_in_progress = 0
        self.deleted_pods: list[str] = []
        # The nodes whose driver pod the controller deleted for the new version, in order.
        self.driver_restarts: list[str] = []
        api.controllers.append(self)

    def policy(self) -> dict[str, Any]:
        policies = self.api.objects("clusterpolicies")
        return (policies[0].get("spec") or {}) if policies else {}

    def uses_nvidia_drivers(self) -> bool:
        """Whether NVIDIADrivers set the version (the ClusterPolicy's useNvidiaDriverCRD, or no ClusterPolicy)."""
        return not self.api.objects("clusterpolicies") or bool(
            (self.policy().get("driver") or {}).get("useNvidiaDriverCRD"))

    def wanted(self, node: dict[str, Any]) -> str:
        labels = node["metadata"].get("labels") or {}
        if not self.uses_nvidia_drivers():
            return str((self.policy().get("driver") or {}).get("version") or "")
        for driver in self.api.objects("nvidiadrivers"):
            spec = driver.get("spec") or {}
            if matches_label_selector({"matchLabels": spec.get("nodeSelector") or {}}, labels):
                return str(spec.get("version") or "")
        return str((self.policy().get("driver") or {}).get("version") or "")

    def started(self, node: str) -> list[str]:
        """The nodes in the order their upgrade began (they left upgrade-required)."""
        return [n for n, s in self.transitions if s == "cordon-required" and (not node or n == node)]

    def _operands(self) -> dict[str, str]:
        """The operand DaemonSets as the operator renders them from its resources: name -> driver version
        ("" for the device plugin and the validator)."""
        drivers = self.api.objects("nvidiadrivers") if self.uses_nvidia_drivers() else []
        wanted = {f"nvidia-gpu-driver-{d['metadata']['name']}": (str((d.get("spec") or {}).get("version") or ""),
                                                                  (d.get("spec") or {}).get("nodeSelector") or {})
                  for d in drivers}
        if not drivers and self.api.objects("clusterpolicies"):
            wanted["nvidia-driver-daemonset"] = (str((self.policy().get("driver") or {}).get("version") or ""), {})
        wanted["nvidia-device-plugin-daemonset"] = ("", {})
        wanted["nvidia-operator-validator"] = ("", {})
        for name, (version, selector) in wanted.items():
            image = f"{DRIVER_IMAGE}:{version}" if version else f"nvcr.io/nvidia/{name}:v24.9.0"
            spec = {"selector": {"matchLabels": {"app": name}},
                    "updateStrategy": {"type": "OnDelete" if version else "RollingUpdate"},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true", **selector},
                        "tolerations": CHART_TOLERATIONS, "priorityClassName": "system-node-critical",
                        # Images are not run here: a container that sleeps stands in for each.
                        "containers": [{"name": "main", "image": image, "command": ["sleep", "86400"]}]}}}
            current = self.api.get("daemonsets", name, NAMESPACE)
            if current is None or current.get("spec") != spec:
                self.api.put("daemonsets", {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})
        return {name: version for name, (version, _) in wanted.items()}

    def operand_pod(self, node: str, prefix: str) -> dict[str, Any] | None:
        """The live pod on `node` of the operand DaemonSet whose name starts with `prefix`."""
        sets = {d["metadata"]["uid"] for d in self.api.objects("daemonsets", NAMESPACE)
                if d["metadata"]["name"].startswith(prefix)}
        return next((p for p in self.api.objects("pods", NAMESPACE)
                     if controller_uid(p) in sets and (p.get("spec") or {}).get("nodeName") == node
                     and not p["metadata"].get("deletionTimestamp")), None)

    def tick(self) -> None:
        with self.api.lock:
            if not (self.api.objects("clusterpolicies") or self.api.objects("nvidiadrivers")):
                return
            self._operands()
            upgrade = self.policy().get("driver", {}).get("upgradePolicy") or {}
            if upgrade.get("autoUpgrade") is False:
                return  # the upgrade controller is off: no node's state moves
            limit = int(upgrade.get("maxParallelUpgrades", 1) or 0)
            nodes = [n for n in self.api.objects("nodes")
                     if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"]
            busy = sum(1 for n in nodes if n["metadata"]["labels"].get(STATE) in IN_PROGRESS)
            for node in nodes:
                busy += self._step(node, bool(upgrade.get("drain", {}).get("enable")), limit, busy)
                self.max_in_progress = max(self.max_in_progress, sum(
                    1 for n in self.api.objects("nodes")
                    if (n["metadata"].get("labels") or {}).get(STATE) in IN_PROGRESS))

    def _move(self, name: str, state: str, change: Any = None) -> None:
        def write(obj: dict[str, Any]) -> None:
            obj["metadata"]["labels"][STATE] = state
            if change:
                change(obj)
        self.api.mutate("nodes", name, "", write)
        self.transitions.append((name, state))
        self.api.record("upgrade-state", f"{name} {state}")

    def _step(self, node: dict[str, Any], drain: bool, limit: int, busy: int) -> int:
        """Advance one node by one state; returns +1 when it started upgrading, -1 when it stopped."""
        meta = node["metadata"]
        name, labels = meta["name"], meta["labels"]
        state = labels.get(STATE, "")
        wanted = self.wanted(node)
        if state in ("", "upgrade-done"):
            if wanted and driver_of(node) != wanted:
                self._move(name, "upgrade-required")
            elif not state:
                self._move(name, "upgrade-done")
            return 0
        if state == "upgrade-required":
            if labels.get(SKIP) == "true" or (limit and busy >= limit) or not wanted:
                return 0
            if driver_of(node) == wanted:
                self._move(name, "upgrade-done")
                return 0

            def initial(obj: dict[str, Any]) -> None:
                if (obj.get("spec") or {}).get("unschedulable"):
                    obj["metadata"].setdefault("annotations", {})[INITIAL] = "true"
            self._move(name, "cordon-required", initial)
            return 1
        if state == "cordon-required":
            self._move(name, "wait-for-jobs-required", lambda o: o.setdefault("spec", {}).update(unschedulable=True))
        elif state == "wait-for-jobs-required":
            self._move(name, "pod-deletion-required")
        elif state == "pod-deletion-required":
            for pod in self.api.objects("pods"):
                if (pod.get("spec") or {}).get("nodeName") == name and gpu_request(pod):
                    self.deleted_pods.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
                    self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
            self._move(name, "drain-required" if drain else "pod-restart-required")
        elif state == "drain-required":
            self._move(name, "pod-restart-required")
        elif state == "pod-restart-required":
            if name in self.fail_nodes:
                self._move(name, "upgrade-failed")
                return -1
            driver = self.operand_pod(name, "nvidia-driver-daemonset") or self.operand_pod(name, "nvidia-gpu-driver-")
            if driver is not None and not driver["spec"]["containers"][0]["image"].endswith(f":{wanted}"):
                self.driver_restarts.append(name)
                self.api.record("driver-pod-deleted", f"{name} {driver['metadata']['name']}")
                self.api.delete_pod(NAMESPACE, driver["metadata"]["name"])
            elif driver is not None and is_healthy(driver):
                self._move(name, "validation-required", lambda o: set_driver(o["metadata"]["labels"], wanted))
            # Otherwise the DaemonSet has not brought the new driver pod back yet (or cannot: a taint).
        elif state == "validation-required":
            validator = self.operand_pod(name, "nvidia-operator-validator")
            if validator is not None and is_healthy(validator):
                self._move(name, "uncordon-required")
        elif state == "uncordon-required":
            def uncordon(obj: dict[str, Any]) -> None:
                if (obj["metadata"].get("annotations") or {}).pop(INITIAL, None) is None:
                    obj.setdefault("spec", {}).pop("unschedulable", None)
            self._move(name, "upgrade-done", uncordon)
            return -1
        return 0
