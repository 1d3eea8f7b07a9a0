"""Pods with zonal and local volumes through campaigns (issue 27, item 6): the test API server over TLS (no
Kubernetes API server can run here) serving PersistentVolumes, StorageClasses and nodes' zone labels as a
real server does, its scheduler placing pods where their volumes attach (the VolumeBinding plugin), kubelet
stand-ins running each container as a real process (no container runtime here), with the Multi-Attach wait
for a ReadWriteOnce claim still used elsewhere, and real node agents. Two zones: n0 and n2 in zone-a, n1 in
zone-b. A pod with a zonal ReadWriteOnce claim moves stop-first, only to n2; a pod on a local volume is
planned as cannot-move, waited for or cold-started, never checkpointed; no workload runs twice."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from campaigns import policy, services
from campaigns.choices import CampaignStatus, EvidenceKind, MoveState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from inventory.models import Node, Workload
from tests.campaigns.fleet import FIXED, drive_until_rest, user
from tests.campaigns.test_kubernetes_campaign import campaign, secrets, synchronous, untouched  # noqa: F401
from tests.campaigns.test_kubernetes_owners import STARTS, starts
from tests.helpers import wait_for
from tests.kube.fleet import KubeFleet
from tests.kube.objects import gpu_pod

pytestmark = pytest.mark.django_db(transaction=True)

ZONE = "topology.kubernetes.io/zone"
FACT = "topology_kubernetes_io_zone"  # as a node fact
ZONES = {"n0": "zone-a", "n1": "zone-b", "n2": "zone-a"}
RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-web"}


def zoned(fleet: KubeFleet) -> None:
    for name, zone in ZONES.items():
        fleet.api.mutate("nodes", name, "", lambda n, z=zone: n["metadata"]["labels"].update({ZONE: z}))


def volume(fleet: KubeFleet, claim: str, pv: str, key: str, values: list[str], *, local: bool = False) -> None:
    """A bound ReadWriteOnce claim and its PersistentVolume, attaching where `key` is one of `values`."""
    source = {"local": {"path": f"/mnt/disks/{pv}"}} if local else {
        "csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": f"projects/p/zones/{values[0]}/disks/{pv}"}}
    fleet.api.put("persistentvolumes", {"metadata": {"name": pv}, "spec": {
        "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"], **source,
        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "local" if local else "zonal",
        "claimRef": {"namespace": "ml", "name": claim},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": values}]}]}}}, "status": {"phase": "Bound"}})
    fleet.api.put("persistentvolumeclaims", {"metadata": {"namespace": "ml", "name": claim}, "spec": {
        "accessModes": ["ReadWriteOnce"], "volumeName": pv, "storageClassName": "local" if local else "zonal",
        "resources": {"requests": {"storage": "100Gi"}}}, "status": {"phase": "Bound"}})


def mount(fleet: KubeFleet, name: str, claim: str) -> None:
    fleet.api.mutate("pods", name, "ml", lambda p: p["spec"].update(
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]))


def planned_moves(made: Any, node: str) -> dict[str, dict[str, Any]]:
    made.refresh_from_db()
    assert made.approved_plan is not None
    return {m["workload"]: m for m in made.approved_plan.content["nodes"][str(Node.objects.get(name=node).pk)]["moves"]}


def test_a_pod_with_a_zonal_readwriteonce_claim_moves_stop_first_only_to_a_node_in_its_zone(tmp_path: Path) -> None:
    """web (a ReplicaSet's, signal engine) holds data-web, a zone-a disk. n1 (zone-b) sorts first among the
    empty receivers, but only n2 shares its zone: the plan says so, the engine chooses n2, the original
    stops before the replacement's container starts, and the counter goes on. About 10 s."""
    with KubeFleet(tmp_path, ["n0", "n1", "n2"]) as fleet:
        api, helpers = fleet.api, fleet.helpers
        zoned(fleet)
        volume(fleet, "data-web", "pv-web", ZONE, ["zone-a"])
        api.put("replicasets", {"metadata": {"namespace": "ml", "name": "web-5d8f", "uid": "rs-web"}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d8f"}}}})
        log = tmp_path / "web.log"
        fleet.counter_pod("ml", "web-5d8f-a", "n0", "signal", log, owner=RS,
                          labels={"app": "web", "pod-template-hash": "5d8f"})
        mount(fleet, "web-5d8f-a", "data-web")
        helpers.wait_steps(log, 3)
        fleet.make_cluster()
        row = Workload.objects.get(name="web-5d8f-a")
        assert row.placement["requires"] == {FACT: "zone-a"}
        assert {c.component: c.version for c in Node.objects.get(name="n1").components.all()}[FACT] == "zone-b"

        made = campaign(["n0"])
        entry = planned_moves(made, "n0")["ml/web-5d8f-a"]
        assert (entry["action"], entry["to_name"]) == ("migrate", "n2"), entry
        assert entry["requires"]["must"] == {FACT: "zone-a"}
        assert f"moves stop-first, to {ZONE} zone-a: data-web attaches to one node at a time" in entry["why"]

        done = drive_until_rest(made.pk, timeout=90)
        assert done.status == CampaignStatus.COMPLETED, (
            done.status_reason,
            list(NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
        move = WorkloadMove.objects.get(sweep__campaign=done)
        assert (move.state, move.target_node.name) == (MoveState.RESTORED, "n2")
        new = move.new_workload_ref
        assert api.get("pods", new.split("/")[1], "ml")["spec"]["nodeName"] == "n2"
        # Stop-first: the original was gone before the replacement's container started (one runs at a time).
        gone = api.happened("deleted", "ml/web-5d8f-a")[0][0]
        assert gone < api.happened("container-started", f"{new} n2 0")[0][0]
        assert [d for _, what, d in api.history if what == "created"] == [new]
        after = helpers.wait_steps(log, len(helpers.steps(log)) + 3)
        assert after == list(range(1, len(after) + 1)), "the counter restarted, skipped or repeated a step"
        assert untouched(fleet, "n0")


def test_with_no_room_in_its_zone_a_zonal_pod_is_never_planned_into_another_zone(tmp_path: Path) -> None:
    """n2 (zone-a) is full: the plan keeps web's checkpoint for n0 itself after the patch (its disk attaches
    there again) rather than n1 in zone-b, which has room; nothing runs in this test beyond the API."""
    with KubeFleet(tmp_path, ["n0", "n1", "n2"], agents=False) as fleet:
        zoned(fleet)
        volume(fleet, "data-web", "pv-web", ZONE, ["zone-a"])
        fleet.api.put("pods", gpu_pod("ml", "web", "n0", 1, annotations={"gpusweep.io/checkpoint": "signal"}))
        mount(fleet, "web", "data-web")
        fleet.api.put("pods", gpu_pod("ml", "big", "n2", 8))
        fleet.make_cluster()
        rita = user("rita", "operator")
        draft = Campaign.objects.create(name="k8s", requested_by=rita, node_selector={"names": ["n0"]},
                                        target_versions={"driver": {"R570": FIXED}}, parallelism_per_cluster="2",
                                        canary="0")
        plan = services.make_plan(draft.pk, rita)
        [entry] = plan.content["nodes"][str(Node.objects.get(name="n0").pk)]["moves"]
        assert (entry["action"], entry["to_name"]) == ("return_home", "n0"), entry
        assert f"moves stop-first, to {ZONE} zone-a" in entry["why"]


def test_a_pod_on_a_local_volume_is_planned_as_cannot_move_and_ends_as_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache and indexer (bare pods, signal engine) each hold a local volume of n0. The plan says neither can
    move; cache is waited for (it ends by itself once released), indexer is told to cold restart: it is
    stopped, and its copy starts again on n0 only, once n0 is back in service (its disk is there). Neither
    is ever checkpointed, and each process starts once per run. About 15 s."""
    monkeypatch.setattr(policy, "WAIT_POLL_S", 1.0)
    python = sys.executable
    release = tmp_path / "release"
    with KubeFleet(tmp_path, ["n0", "n1"]) as fleet:
        api = fleet.api
        for name, seconds in (("cache", 3), ("indexer", 600)):
            volume(fleet, f"scratch-{name}", f"local-{name}", "kubernetes.io/hostname", ["n0"], local=True)
            api.put("pods", gpu_pod("ml", name, "n0", 1, annotations={"gpusweep.io/checkpoint": "signal"},
                                    restart_policy="Never", command=[python, "-c", STARTS,
                                                                     str(tmp_path / f"{name}.starts"), str(seconds),
                                                                     str(release)]))
            mount(fleet, name, f"scratch-{name}")
        assert wait_for(lambda: all(starts(tmp_path / f"{n}.starts") for n in ("cache", "indexer")), 10, 0.1)
        fleet.make_cluster()
        made = campaign(["n0"], workload_overrides={"indexer": "cold_restart"})
        planned = planned_moves(made, "n0")
        pinned = "volume of claim scratch-{} (PersistentVolume local-{}, a local volume) is pinned to node n0"
        assert planned["ml/cache"]["action"] == "finish_first", planned["ml/cache"]
        assert f"cannot move: {pinned.format('cache', 'cache')}" in planned["ml/cache"]["why"]
        assert planned["ml/indexer"]["action"] == "cold_start", planned["ml/indexer"]
        assert f"cannot move: {pinned.format('indexer', 'indexer')}" in planned["ml/indexer"]["why"]

        release.touch()  # cache ends about 3 s into the campaign
        done = drive_until_rest(made.pk, timeout=120)
        assert done.status == CampaignStatus.COMPLETED, (
            done.status_reason,
            list(NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
        moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done)}
        assert {ref: m.state for ref, m in moves.items()} == {"ml/cache": MoveState.FINISHED,
                                                               "ml/indexer": MoveState.STOPPED}
        assert not any(m.checkpoint_id for m in moves.values())
        assert not EvidenceEvent.objects.filter(campaign=done, kind=EvidenceKind.CHECKPOINTED).exists()
        assert not api.happened("proxied") and not [e for e in api.history if "checkpoint-id" in e[2]]
        waits = EvidenceEvent.objects.filter(campaign=done, kind=EvidenceKind.WAITING)
        assert any("cache cannot move (volume of claim scratch-cache" in str(e.data) for e in waits)
        assert len(starts(tmp_path / "cache.starts")) == 1
        # indexer's copy comes back on n0 alone (n1 has no access to the disk), after the original died.
        copy = wait_for(lambda: next((p for p in api.objects("pods", "ml") if p["metadata"]["name"].startswith(
            "indexer-") and p["spec"].get("nodeName")), None), 15, 0.1)
        assert copy["spec"]["nodeName"] == "n0"
        assert wait_for(lambda: len(starts(tmp_path / "indexer.starts")) == 2, 15, 0.1)
        gone = api.happened("deleted", "ml/indexer")[0][0]
        begun = wait_for(lambda: api.happened("container-started", f"ml/{copy['metadata']['name']} n0 0"), 10, 0.1)
        assert gone < begun[0][0]
        assert untouched(fleet, "n0")
