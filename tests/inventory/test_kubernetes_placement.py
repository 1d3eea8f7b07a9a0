"""Where a pod's volumes let it move (issue 27, item 6), read from the objects as the API serves them:
a bound PersistentVolume's required node affinity, an unbound claim's WaitForFirstConsumer StorageClass,
the claim's access modes, and the kubelet path's progress marker."""

from __future__ import annotations

from typing import Any

from executors import portability
from inventory.sources.kubernetes import NO_PROGRESS_MARKER, node_from_kubernetes, pod_placement
from tests.kube.objects import gpu_node, gpu_pod

ZONE = "topology.kubernetes.io/zone"
FACT = "topology_kubernetes_io_zone"  # as a node fact
HERE = {ZONE: "zone-a", "topology.kubernetes.io/region": "r1", "kubernetes.io/hostname": "n0"}


def claim(name: str, modes: list[str], volume: str = "", storage_class: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": modes, **({"volumeName": volume} if volume else {}),
                            **({"storageClassName": storage_class} if storage_class else {})}
    return {"metadata": {"namespace": "ml", "name": name}, "spec": spec}


def volume(name: str, key: str, values: list[str], local: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]}}}
    if local:
        spec["local"] = {"path": "/mnt/disks/ssd0"}
    return {"metadata": {"name": name}, "spec": spec}


def placed(claims: list[dict[str, Any]], volumes: list[dict[str, Any]] = (), classes: list[dict[str, Any]] = (),
           connection: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> Any:
    pod = gpu_pod("ml", "web", "n0", 1, annotations=annotations)
    pod["spec"]["volumes"] = [{"name": c["metadata"]["name"], "persistentVolumeClaim": {
        "claimName": c["metadata"]["name"]}} for c in claims]
    by_claim = {("ml", c["metadata"]["name"]): c for c in claims}
    return pod_placement(pod, HERE, lambda ns, n: by_claim.get((ns, n)),
                         {v["metadata"]["name"]: v for v in volumes}.get,
                         {c["metadata"]["name"]: c for c in classes}.get, connection)


def test_a_zonal_readwriteonce_volume_moves_stop_first_to_its_zone() -> None:
    found = placed([claim("data", ["ReadWriteOnce"], "pv-1")], [volume("pv-1", ZONE, ["zone-a"])])
    assert (found.requires, found.stop_first, found.pinned) == ({FACT: "zone-a"}, ("data",), "")
    assert found.notes == (f"moves stop-first, to {ZONE} zone-a: data attaches to one node at a time",)
    # The requirement is a fact the receiver must share: a node reports its zone label as one.
    facts = node_from_kubernetes(gpu_node("n2", labels={ZONE: "zone-b"})).components
    needed = portability.requirements("signal", {}, requires=portability.placement_requires(found.as_dict()))
    assert portability.mismatches(needed, facts) == {FACT: ("zone-a", "zone-b")}
    assert portability.compatible(needed, node_from_kubernetes(gpu_node("n3", labels={ZONE: "zone-a"})).components)


def test_a_regional_volume_keeps_its_pod_in_the_zone_it_runs_in_and_a_shared_one_moves_without_stopping_first(
) -> None:
    found = placed([claim("shared", ["ReadWriteMany"], "pv-2")], [volume("pv-2", ZONE, ["zone-a", "zone-b"])])
    assert (found.requires, found.stop_first) == ({FACT: "zone-a"}, ())
    assert found.notes == (f"moves to {ZONE} zone-a, where its volumes attach",)


def test_an_unbound_wait_for_first_consumer_claim_follows_its_storage_class_topology() -> None:
    classes = [{"metadata": {"name": "late"}, "provisioner": "pd.csi.storage.gke.io",
                "volumeBindingMode": "WaitForFirstConsumer", "allowedTopologies": [{"matchLabelExpressions": [
                    {"key": "topology.gke.io/zone", "values": ["us-central1-b"]}]}]},
               {"metadata": {"name": "now"}, "provisioner": "x", "volumeBindingMode": "Immediate",
                "allowedTopologies": [{"matchLabelExpressions": [{"key": ZONE, "values": ["zone-c"]}]}]}]
    found = placed([claim("late", ["ReadWriteOnce"], storage_class="late"),
                    claim("now", ["ReadWriteOnce"], storage_class="now")], classes=classes)
    assert found.requires == {"topology_gke_io_zone": "us-central1-b"} and found.stop_first == ("late", "now")


def test_a_local_volume_or_one_keyed_by_an_unread_label_pins_its_pod() -> None:
    found = placed([claim("scratch", ["ReadWriteOnce"], "local-n0")],
                   [volume("local-n0", "kubernetes.io/hostname", ["n0"], local=True)])
    assert found.pinned == "volume of claim scratch (PersistentVolume local-n0, a local volume) is pinned to node n0"
    assert found.notes == (f"cannot move: {found.pinned}",)
    assert portability.placement_requires(found.as_dict()) == {portability.PINNED: found.pinned}
    odd = placed([claim("rack", ["ReadWriteOnce"], "pv-r")], [volume("pv-r", "example.com/rack", ["r7"])])
    assert "attaches by node label example.com/rack, which gpusweep does not read" in odd.pinned
    # Unless the site names it: then it is a fact like a zone.
    pod = gpu_pod("ml", "web", "n0", 1)
    pod["spec"]["volumes"] = [{"name": "rack", "persistentVolumeClaim": {"claimName": "rack"}}]
    named = pod_placement(pod, {"example.com/rack": "r7"}, lambda ns, n: claim("rack", ["ReadWriteOnce"], "pv-r"),
                          lambda n: volume("pv-r", "example.com/rack", ["r7"]), lambda n: None,
                          {"topology_labels": ["example.com/rack"]})
    assert (named.pinned, named.requires) == ("", {"example_com_rack": "r7"})


def test_a_kubelet_path_pod_without_a_progress_marker_is_said_unverified_or_refused_where_required() -> None:
    kubelet = {"gpusweep.io/checkpoint-via": "kubelet"}
    assert placed([], connection={}, annotations=kubelet).notes == (NO_PROGRESS_MARKER,)
    assert placed([], connection={}, annotations={**kubelet, "gpusweep.io/progress-pattern": r"(\d+)"}).notes == ()
    assert placed([], connection={"checkpoint_via": "kubelet"}).notes == (NO_PROGRESS_MARKER,)
    required = placed([], connection={"require_progress_marker": True}, annotations=kubelet).notes
    assert required == ("not checkpointed: no progress marker (gpusweep.io/progress-pattern), which the site "
                        "requires (require_progress_marker)",)
    assert placed([], connection={}).notes == ()  # the agent path verifies its restores itself
