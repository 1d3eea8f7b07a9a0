"""A Kubernetes campaign whose executor holds exactly the shipped rights (issue 27, done-when 2): the
test API server (no Kubernetes API server can run here) loads deploy/kubernetes's ServiceAccounts,
ClusterRoles and bindings and authorizes gpusweep's requests, made with a token bound to its
ServiceAccount, by them (tests/kube/rbac.py), including the owner-reference admission checks. Kubelet
stand-ins run each container as a real process (no container runtime here); the node agents are real.
With the base role only (no ``nodes/proxy``), the agent path moves a ReplicaSet's pod and patches its
node, and the kubelet checkpoint path fails its node with the 403 named. About 15 s on a quiet 2-core
machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from campaigns import services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, NodeSweep, WorkloadMove
from tests.campaigns.fleet import FIXED, drive, user
from tests.campaigns.test_kubernetes_campaign import campaign, secrets, untouched  # noqa: F401
from tests.helpers import REPO, wait_for
from tests.kube.fleet import KubeFleet
from tests.kube.objects import gpu_pod
from tests.kube.rbac import load_manifests

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-web"}


def another_campaign(names: list[str]) -> Campaign:
    """A second campaign as `campaign` makes one, by other people (each user is made once)."""
    mia, tom = user("mia", "operator"), user("tom", "approver")
    made = Campaign.objects.create(name="k8s-2", requested_by=mia, node_selector={"names": names},
                                   target_versions={"driver": {"R570": FIXED}}, parallelism_per_cluster="1",
                                   step_timeout_s=60, canary="0", error_budget="1")
    services.make_plan(made.pk, mia)
    services.approve(made.pk, tom)
    services.start(made.pk, mia)
    return made


def test_a_campaign_with_the_shipped_base_role_moves_by_agent_and_the_kubelet_path_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The kubelet path's registry is never reached: the node proxy's 403 comes first.
    with KubeFleet(tmp_path, ["n0", "n1", "n2"],
                   connection={"checkpoint_image_repository": "http://127.0.0.1:9/checkpoints"}) as fleet:
        api, helpers = fleet.api, fleet.helpers
        shipped = load_manifests(api, REPO / "deploy" / "kubernetes")
        assert {o["metadata"]["name"] for o in shipped if o["kind"] == "ClusterRole"} == {"gpusweep-executor"}
        # The sync and the executor read the token from this variable (the cluster's secret_env).
        monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", api.service_account_token("gpusweep", "gpusweep"))
        api.put("replicasets", {"metadata": {"namespace": "ml", "name": "web-5d8f", "uid": "rs-web"}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "web", "pod-template-hash": "5d8f"}}}})
        log = tmp_path / "web.log"
        fleet.counter_pod("ml", "web-5d8f-a", "n0", "signal", log, owner=OWNER,
                          labels={"app": "web", "pod-template-hash": "5d8f"})
        # A pod whose site asked for the kubelet's checkpoint, on n2.
        api.put("pods", gpu_pod("ml", "kv", "n2", 1, command=[sys.executable, "-c", "import time; time.sleep(600)"],
                                annotations={"gpusweep.io/checkpoint": "criu",
                                             "gpusweep.io/checkpoint-via": "kubelet"}))
        helpers.wait_steps(log, 3)
        fleet.make_cluster()

        done = drive(campaign(["n0"]).pk)
        assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
            NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
        move = WorkloadMove.objects.get(sweep__campaign=done)
        assert move.state == MoveState.RESTORED and move.target_node.name == "n1"
        replacement = api.get("pods", move.new_workload_ref.split("/")[1], "ml")
        assert replacement["metadata"]["ownerReferences"][0]["uid"] == "rs-web"  # handed to its ReplicaSet
        assert fleet.agents["n0"].client.request("GET", "/v1/facts")[1]["components"]["driver"] == FIXED
        assert untouched(fleet, "n0")
        after = helpers.wait_steps(log, len(helpers.steps(log)) + 3)
        assert after == list(range(1, len(after) + 1)), "the counter restarted, skipped or repeated a step"
        assert not api.happened("forbidden"), api.happened("forbidden")
        assert not [w for w in api.writes if w[0] == "DELETE"], "the executor deletes no object"

        failed = drive(another_campaign(["n2"]).pk)
        sweep = NodeSweep.objects.get(campaign=failed, node__name="n2")
        assert sweep.state == SweepState.FAILED, (failed.status, sweep.state, sweep.error)
        assert "needs create on nodes/proxy" in sweep.error and "optional/kubelet-checkpoint.yaml" in sweep.error
        assert api.happened("forbidden", "system:serviceaccount:gpusweep:gpusweep create nodes/proxy")
        assert untouched(fleet, "n2") and not api.happened("proxied")
        assert wait_for(lambda: api.get("pods", "kv", "ml")["status"].get("phase") == "Running", 5, 0.1)
