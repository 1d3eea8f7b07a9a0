"""The test API server's DaemonSet controller (tests/kube/apiserver.py ``DaemonSets``) against the
rules of the real one: a daemon pod goes only where the template's tolerations (plus the ones the
controller adds) cover every NoSchedule and NoExecute taint; a cordon never keeps it out; a new
NoSchedule taint leaves a running pod alone, a NoExecute one removes it, and a deleted pod comes back
only where it is still tolerated. No Kubernetes API server can run on these machines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.gpu_operator import CHART_TOLERATIONS
from tests.kube.objects import gpu_node

MAINTENANCE = {"key": "gpusweep.io/maintenance", "value": "campaign-1", "effect": "NoSchedule"}


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as api:
        api.nodes = [
            gpu_node("clean"),
            gpu_node("gpu-tainted"),
            gpu_node("maintenance"),
            gpu_node("cordoned"),
            gpu_node("cpu", labels={"nvidia.com/gpu.present": "false"}),
        ]
        api.mutate(
            "nodes",
            "gpu-tainted",
            "",
            lambda n: n["spec"].update(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        )
        api.mutate("nodes", "maintenance", "", lambda n: n["spec"].update(taints=[MAINTENANCE]))
        api.mutate("nodes", "cordoned", "", lambda n: n["spec"].update(unschedulable=True))
        yield api


def placed(api: KubeApiServer) -> dict[str, str]:
    """node -> the name of the live daemon pod bound there."""
    return {
        p["spec"]["nodeName"]: p["metadata"]["name"]
        for p in api.objects("pods", "gpu-operator")
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    }


def test_a_daemon_pod_goes_where_its_tolerations_cover_every_taint_and_never_where_they_do_not(
    kube: KubeApiServer,
) -> None:
    kube.put(
        "daemonsets",
        {
            "metadata": {"namespace": "gpu-operator", "name": "nvidia-driver-daemonset"},
            "spec": {
                "selector": {"matchLabels": {"app": "driver"}},
                "template": {
                    "metadata": {"labels": {"app": "driver"}},
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "tolerations": CHART_TOLERATIONS,
                        "containers": [{"name": "main", "image": "nvcr.io/nvidia/driver:570.86.15"}],
                    },
                },
            },
        },
    )
    assert wait_for(lambda: set(placed(kube)) == {"clean", "gpu-tainted", "cordoned"}, 5, 0.05), placed(kube)
    pod = kube.get("pods", placed(kube)["clean"], "gpu-operator")
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert not [
        p for p in kube.objects("pods", "gpu-operator") if p["spec"].get("nodeName") in ("maintenance", "cpu")
    ], "an untolerated taint or an unmatched selector gets no pod"

    # A NoSchedule taint arriving later leaves the running pod alone, but once it is deleted (as the GPU
    # Operator deletes the driver pod at pod-restart-required) nothing comes back.
    first = placed(kube)["clean"]
    kube.mutate("nodes", "clean", "", lambda n: n["spec"].update(taints=[MAINTENANCE]))
    kube.delete_pod("gpu-operator", placed(kube)["gpu-tainted"])  # tolerated: comes back
    assert wait_for(lambda: "gpu-tainted" in placed(kube), 5, 0.05)
    assert placed(kube)["clean"] == first
    kube.delete_pod("gpu-operator", first)
    assert wait_for(lambda: "clean" not in placed(kube), 5, 0.05)
    assert not wait_for(lambda: "clean" in placed(kube), 0.5, 0.05), "the untolerated taint let a pod back"
    # An untolerated NoExecute taint removes the pod that runs there.
    kube.mutate(
        "nodes",
        "gpu-tainted",
        "",
        lambda n: n["spec"].update(taints=[{"key": "example.com/broken", "effect": "NoExecute"}]),
    )
    assert wait_for(lambda: "gpu-tainted" not in placed(kube), 5, 0.05)
