"""Kubernetes objects as a cluster with GPU feature discovery and the GPU Operator shows them."""

from __future__ import annotations

from typing import Any


def gpu_node(name: str, *, product: str = "NVIDIA-H100-80GB-HBM3", count: int = 8, driver: str = "570.86.15",
             cuda: str = "12.8", pool: str = "h100", ready: bool = True, unschedulable: bool = False,
             kernel: str = "5.15.0-1053-nvidia", labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    major, minor, *rest = driver.split(".")
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "cloud.google.com/gke-nodepool": pool,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rest[0] if rest else "",
        "nvidia.com/cuda.runtime.major": cuda.split(".")[0],
        "nvidia.com/cuda.runtime.minor": cuda.split(".")[1],
        **(labels or {}),
    }
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": annotations or {}},
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": {
            "capacity": {"cpu": "96", "memory": "1056495360Ki", "nvidia.com/gpu": str(count)},
            "allocatable": {"cpu": "95", "memory": "1056000000Ki", "nvidia.com/gpu": str(count)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kernelVersion": kernel, "osImage": "Ubuntu 22.04.4 LTS", "operatingSystem": "linux",
                         "architecture": "amd64", "kubeletVersion": "v1.37.0",
                         "containerRuntimeVersion": "containerd://2.1.4"},
        },
    }


def gpu_pod(namespace: str, name: str, node: str | None, gpus: int, *, phase: str = "Running",
            annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
            command: list[str] | None = None, env: dict[str, str] | None = None,
            owner: dict[str, Any] | None = None, restart_policy: str = "Always") -> dict[str, Any]:
    """A pod asking for `gpus` GPUs; with `command` its container really runs under a kubelet stand-in."""
    container: dict[str, Any] = {"name": "main", "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}}
    if command:
        container["command"] = command
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "annotations": annotations or {},
                            "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"controller": True, "blockOwnerDeletion": True, **owner}]
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"activeDeadlineSeconds": 86400, "restartPolicy": restart_policy, "containers": [container],
                 "terminationGracePeriodSeconds": 5},
    }
    if node:
        pod["spec"]["nodeName"] = node
    if not command:
        pod["status"] = {"phase": phase, "startTime": "2026-11-30T07:00:00Z",
                         "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
                         "containerStatuses": [{"name": "main", "ready": phase == "Running", "restartCount": 0,
                                                "image": container["image"],
                                                "state": {"running": {"startedAt": "2026-11-30T07:00:00Z"}}}]}
    return pod


def cluster_policy(version: str, max_parallel: int = 1, *, nvidia_driver_crd: bool = False,
                   auto_upgrade: bool = True) -> dict[str, Any]:
    return {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
            "spec": {"driver": {"enabled": True, "version": version, "repository": "nvcr.io/nvidia",
                                "image": "driver", "useNvidiaDriverCRD": nvidia_driver_crd, "upgradePolicy": {
                                    "autoUpgrade": auto_upgrade, "maxParallelUpgrades": max_parallel,
                                    "maxUnavailable": "25%",
                                    "waitForCompletion": {"timeoutSeconds": 0},
                                    "podDeletion": {"force": False, "timeoutSeconds": 300},
                                    "drain": {"enable": False, "force": False, "timeoutSeconds": 300}}}}}


def nvidia_driver(name: str, version: str, node_selector: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver", "metadata": {"name": name},
            "spec": {"driverType": "gpu", "repository": "nvcr.io/nvidia", "image": "driver", "version": version,
                     "nodeSelector": node_selector}}


def pdb(namespace: str, name: str, match: dict[str, str], *, min_available: int | None = None,
        max_unavailable: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": match}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"namespace": namespace, "name": name}, "spec": spec}


def gpu_like_pods() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pods holding GPUs in every form the scheduler knows, and the resource claims two of them use."""
    mig = gpu_pod("ml", "mig-only", "n1", 0)
    mig["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    init = gpu_pod("ml", "warmup", "n1", 0)
    init["spec"]["initContainers"] = [{"name": "load", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
    sidecar = gpu_pod("ml", "with-sidecar", "n1", 1)
    sidecar["spec"]["initContainers"] = [{"name": "proxy", "image": "x", "restartPolicy": "Always",
                                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    shared = gpu_pod("ml", "shared", "n1", 0)
    shared["spec"]["containers"][0]["resources"] = {"limits": {"example.com/shared-gpu": "1"}}
    dra = gpu_pod("ml", "dra", "n1", 0)
    dra["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "two-gpus"}]
    templated = gpu_pod("ml", "dra-templated", "n1", 0)
    templated["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    templated["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "dra-templated-gpu-x7"}]
    fpga = gpu_pod("ml", "fpga", "n1", 0)
    fpga["spec"]["resourceClaims"] = [{"name": "fpga", "resourceClaimName": "an-fpga"}]
    claims = [
        {"metadata": {"namespace": "ml", "name": "two-gpus"}, "spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}},
         "status": {"allocation": {"devices": {"results": [
             {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1", "device": f"gpu-{i}"} for i in (0, 1)]}}}},
        {"metadata": {"namespace": "ml", "name": "dra-templated-gpu-x7"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}},
        {"metadata": {"namespace": "ml", "name": "an-fpga"}, "spec": {"devices": {"requests": [
            {"name": "fpga", "exactly": {"deviceClassName": "fpga.example.com"}}]}}},
    ]
    return [mig, init, sidecar, shared, dra, templated, fpga], claims
