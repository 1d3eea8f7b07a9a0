"""Pods of each kind of owner through one campaign (issue 27, item 5): the test API server over TLS
(no Kubernetes API server can run here), kubelet stand-ins running each container as a real process
(no container runtime here), real node agents, and stand-ins for the owners' controllers
(tests/kube/controllers.py: no controller manager or operator can run here), which start a pod of
theirs again when it is deleted. A Deployment's pod is checkpointed and moved (its ReplicaSet adopts
the copy); a Job's pod and an unknown controller's pod are waited for; a PyTorchJob's pod, told to cold
restart, is evicted and started again by its controller. None is ever copied but the ReplicaSet's, and
no workload runs twice: each process writes a line when it starts. About 20 s and 10 s on a
quiet 2-core machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from campaigns import policy
from campaigns.choices import CampaignStatus, MoveState
from campaigns.models import NodeSweep, WorkloadMove
from inventory.models import Node, Workload
from tests.campaigns.fleet import drive_until_rest
from tests.campaigns.test_kubernetes_campaign import campaign, secrets, synchronous, untouched  # noqa: F401
from tests.helpers import wait_for
from tests.kube.controllers import Restarts
from tests.kube.fleet import KubeFleet
from tests.kube.objects import gpu_pod

pytestmark = pytest.mark.django_db(transaction=True)

# A process that says it started (its pid, one line) and runs until argv[3] exists, then argv[2] seconds more.
STARTS = (
    "import os, sys, time; open(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\n"
    "while not os.path.exists(sys.argv[3]): time.sleep(0.1)\n"
    "time.sleep(float(sys.argv[2]))"
)
OWNERS = {
    "web": {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-web"},
    "eval": {"apiVersion": "batch/v1", "kind": "Job", "name": "eval", "uid": "job-eval"},
    "llama": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama", "uid": "ptj-llama"},
    "sweep": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "sweep", "uid": "wf-sweep"},
}


def template(pod: dict[str, Any]) -> dict[str, Any]:
    """What the controller stamps its pods from: the pod without its identity, node and status."""
    meta = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    return {"metadata": meta, "spec": {k: v for k, v in pod["spec"].items() if k != "nodeName"}}


def starts(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_each_owner_kind_ends_as_the_plan_says_and_no_workload_runs_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "WAIT_POLL_S", 1.0)
    python = sys.executable
    with KubeFleet(tmp_path, ["n0", "n1"]) as fleet:
        api, helpers = fleet.api, fleet.helpers
        api.put(
            "replicasets",
            {
                "metadata": {"namespace": "ml", "name": "web-5d8f", "uid": "rs-web"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d8f"}}},
            },
        )
        log, release = tmp_path / "web.log", tmp_path / "release"
        pods = {
            "web": fleet.counter_pod(
                "ml",
                "web-5d8f-a",
                "n0",
                "signal",
                log,
                owner=OWNERS["web"],
                labels={"app": "web", "pod-template-hash": "5d8f"},
            )
        }
        # The Job's and the unknown controller's pods end by themselves; the PyTorchJob's runs on.
        for key, name, seconds in (("eval", "eval-x", 4), ("sweep", "sweep-step", 4), ("llama", "llama-worker-0", 600)):
            pods[key] = api.put(
                "pods",
                gpu_pod(
                    "ml",
                    name,
                    "n0",
                    1,
                    annotations={"gpusweep.io/checkpoint": "signal"},
                    owner=OWNERS[key],
                    restart_policy="Never" if seconds < 600 else "OnFailure",
                    command=[python, "-c", STARTS, str(tmp_path / f"{key}.starts"), str(seconds), str(release)],
                ),
            )
        controllers = {key: Restarts(api, OWNERS[key], template(pod), namespace="ml") for key, pod in pods.items()}
        helpers.wait_steps(log, 3)
        assert wait_for(lambda: all(starts(tmp_path / f"{k}.starts") for k in ("eval", "sweep", "llama")), 10, 0.1)
        fleet.make_cluster()
        rows = {w.name: w for w in Workload.objects.all()}
        assert (rows["eval-x"].policy, rows["eval-x"].owner) == ("wait", "Job batch/v1 eval")
        assert (rows["llama-worker-0"].policy, rows["llama-worker-0"].checkpoint_engine) == ("wait", "none")
        assert rows["sweep-step"].policy == "wait" and rows["web-5d8f-a"].policy == "checkpoint"

        made = campaign(["n0"], workload_overrides={"llama-worker-0": "cold_restart"})
        made.refresh_from_db()
        assert made.approved_plan is not None
        planned = {
            m["workload"]: m for m in made.approved_plan.content["nodes"][str(Node.objects.get(name="n0").pk)]["moves"]
        }
        assert planned["ml/web-5d8f-a"]["action"] == "migrate" and planned["ml/web-5d8f-a"]["to_name"] == "n1"
        for ref, owner in (
            ("ml/eval-x", "Job batch/v1 eval"),
            ("ml/sweep-step", "Workflow argoproj.io/v1alpha1 sweep"),
        ):
            assert (
                planned[ref]["action"] == "finish_first" and f"owned by {owner}, never copied" in planned[ref]["why"]
            ), planned[ref]
        assert planned["ml/llama-worker-0"]["action"] == "cold_start"
        assert planned["ml/llama-worker-0"]["restarted_by"] == "PyTorchJob kubeflow.org/v1 llama"

        release.touch()  # the Job's and the unknown controller's pods end about 4 s into the campaign
        done = drive_until_rest(made.pk, timeout=120)
        assert done.status == CampaignStatus.COMPLETED, (
            done.status_reason,
            list(NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")),
        )
        moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done)}
        assert {ref: m.state for ref, m in moves.items()} == {
            "ml/web-5d8f-a": MoveState.RESTORED,
            "ml/eval-x": MoveState.FINISHED,
            "ml/sweep-step": MoveState.FINISHED,
            "ml/llama-worker-0": MoveState.STOPPED,
        }
        assert untouched(fleet, "n0")

        # Only the ReplicaSet's pod was copied (one pod created through the API), and its ReplicaSet adopted
        # the copy without starting a pod of its own; the counter went on from its checkpoint.
        created = [d for _, what, d in api.history if what == "created"]
        assert created == [moves["ml/web-5d8f-a"].new_workload_ref], created
        assert controllers["web"].started == [] and [p["metadata"]["name"] for p in controllers["web"].owned()] == [
            moves["ml/web-5d8f-a"].new_workload_ref.split("/")[1]
        ]
        after = helpers.wait_steps(log, len(helpers.steps(log)) + 3)
        assert after == list(range(1, len(after) + 1)), "the web counter restarted, skipped or repeated a step"
        # The Job's and the unknown controller's pods ran once, to their end, where they were.
        for key in ("eval", "sweep"):
            assert len(starts(tmp_path / f"{key}.starts")) == 1 and controllers[key].started == []
        # The PyTorchJob's pod: evicted, its process gone before its controller's new pod started on n1.
        [again] = controllers["llama"].started
        assert wait_for(lambda: len(starts(tmp_path / "llama.starts")) == 2, 10, 0.1)
        gone = api.happened("deleted", "ml/llama-worker-0")[0][0]
        begun = wait_for(lambda: api.happened("container-started", f"ml/{again} n1 0"), 10, 0.1)[0][0]
        assert api.happened("evicted", "ml/llama-worker-0") and gone < begun


def test_a_statefulset_pod_with_a_readwriteonce_claim_stops_first_and_comes_back_where_its_volume_attaches(
    tmp_path: Path,
) -> None:
    """Issue 27, item 6: db-0 (a StatefulSet's, signal engine) holds the ReadWriteOnce claim data-db-0. It is
    checkpointed, the original stops first (its volume is free only then: the kubelet stand-in keeps a second
    user of the claim in ContainerCreating, as the Multi-Attach error does), its StatefulSet starts db-0 again
    on the spare n1 under the same name and claim, and n1's agent restores the checkpoint into it. gpusweep
    creates no pod; one db-0 runs at a time; the counter goes on. About 10 s."""
    with KubeFleet(tmp_path, ["n0", "n1"]) as fleet:
        api, helpers = fleet.api, fleet.helpers
        api.put(
            "persistentvolumeclaims",
            {
                "metadata": {"namespace": "ml", "name": "data-db-0"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
                "status": {"phase": "Bound"},
            },
        )
        owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "sts-db"}
        log = tmp_path / "db.log"
        fleet.counter_pod("ml", "db-0", "n0", "signal", log, owner=owner)
        api.mutate(
            "pods",
            "db-0",
            "ml",
            lambda p: p["spec"].update(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]),
        )
        first = api.get("pods", "db-0", "ml")
        statefulset = Restarts(api, owner, template(first), namespace="ml", names=("db-0",))
        helpers.wait_steps(log, 3)
        fleet.make_cluster()
        made = campaign(["n0"])
        made.refresh_from_db()
        assert made.approved_plan is not None
        [planned] = made.approved_plan.content["nodes"][str(Node.objects.get(name="n0").pk)]["moves"]
        assert (planned["workload"], planned["action"], planned["to_name"]) == ("ml/db-0", "migrate", "n1")

        done = drive_until_rest(made.pk, timeout=90)
        assert done.status == CampaignStatus.COMPLETED, (
            done.status_reason,
            list(NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")),
        )
        move = WorkloadMove.objects.get(sweep__campaign=done)
        assert (move.state, move.new_workload_ref, move.target_node.name) == (MoveState.RESTORED, "ml/db-0", "n1")
        again = api.get("pods", "db-0", "ml")
        assert again["spec"]["nodeName"] == "n1" and again["metadata"]["uid"] != first["metadata"]["uid"]
        assert again["metadata"]["labels"]["gpusweep.io/restored-from"] == move.checkpoint_id
        claim = api.get("persistentvolumeclaims", "data-db-0", "ml")["metadata"]
        marks = {**claim.get("labels", {}), **claim.get("annotations", {})}
        assert not any(k.startswith("gpusweep.io/") for k in marks), "the claim keeps no record once restored"
        # Its StatefulSet made the one new pod, after the original was gone; gpusweep created none.
        assert statefulset.started == ["db-0"] and not [d for _, what, d in api.history if what == "created"]
        gone = api.happened("deleted", "ml/db-0")[0][0]
        assert gone < api.happened("container-started", "ml/db-0 n1 0")[0][0]
        after = helpers.wait_steps(log, len(helpers.steps(log)) + 3)
        assert after == list(range(1, len(after) + 1)), "the counter restarted, skipped or repeated a step"
        assert untouched(fleet, "n0")
