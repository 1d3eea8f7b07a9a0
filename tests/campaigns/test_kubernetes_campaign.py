"""Campaigns through the engine on a Kubernetes cluster (tests/kube/fleet.py): the test API server
over TLS (no Kubernetes API server can run on these machines), kubelet stand-ins running each
pod's container as a real process (no container runtime here), real node agents, real CRIU and
the signal engine, and the GPU Operator stand-in (no GPU here). The engine is driven
synchronously, as Celery would run its tasks (tests/campaigns/fleet.py ``drive``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpusweep_agent.workloads import device_holders

from campaigns import engine, policy, queue, services
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, WorkloadMove
from conftest import need
from executors.base import UNDECLARED
from executors.kubernetes import TAINT
from inventory.models import Node, Workload
from tests.campaigns.fleet import FIXED, OLD, drive, drive_until_rest, user
from tests.helpers import HOLDER, cgroups_writable, in_cgroup, wait_for
from tests.kube.fleet import KubeFleet, agent_helpers
from tests.kube.gpu_operator import SKIP, STATE, GpuOperator
from tests.kube.objects import cluster_policy, gpu_pod, pdb

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def synchronous() -> Iterator[None]:
    """drive() runs every step itself: nothing goes to a broker."""
    queue.ENQUEUE.insert(0, lambda task, object_id, countdown: None)
    yield
    queue.ENQUEUE.pop(0)


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch, settings) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "test-token")
    settings.GPUSWEEP_AGENT_FLEET_SECRET = agent_helpers().FLEET_SECRET


def campaign(names: list[str], **fields: object) -> Campaign:
    rita, alan = user("rita", "operator"), user("alan", "approver")
    made = Campaign.objects.create(**{"name": "k8s", "requested_by": rita, "node_selector": {"names": names},
                                      "target_versions": {"driver": {"R570": FIXED}},
                                      "parallelism_per_cluster": "2", "step_timeout_s": 60, "canary": "0", **fields})
    services.make_plan(made.pk, rita)
    services.approve(made.pk, alan)
    services.start(made.pk, rita)
    return made


def untouched(fleet: KubeFleet, name: str) -> bool:
    node = fleet.api.get("nodes", name)
    return not node["spec"].get("unschedulable") and not any(
        t["key"] == TAINT for t in node["spec"].get("taints") or [])


@pytest.fixture
def moving_fleet(tmp_path: Path) -> Iterator[KubeFleet]:
    helpers = agent_helpers()
    need(helpers.criu_usable(), helpers.CRIU_HINT)
    with KubeFleet(tmp_path, ["n0", "n1", "n2", "n3"]) as fleet:
        yield fleet


def test_a_campaign_moves_each_pod_to_a_compatible_node_where_its_counter_goes_on(
        moving_fleet: KubeFleet, tmp_path: Path) -> None:
    """Done-when 1: 2 of 4 nodes swept; a signal pod and a CRIU pod each continue on a spare."""
    fleet, helpers = moving_fleet, moving_fleet.helpers
    logs = {"n0": tmp_path / "counter-a.log", "n1": tmp_path / "counter-b.log"}
    fleet.counter_pod("ml", "trainer-a", "n0", "signal", logs["n0"])
    fleet.counter_pod("ml", "trainer-b", "n1", "criu", logs["n1"])
    for log in logs.values():
        helpers.wait_steps(log, 5)
    fleet.make_cluster()
    assert Workload.objects.filter(scheduler_id__in=["ml/trainer-a", "ml/trainer-b"]).count() == 2

    done = drive(campaign(["n0", "n1"]).pk)
    assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
        NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
    for node in ("n0", "n1"):
        assert untouched(fleet, node), fleet.api.get("nodes", node)["spec"]
        assert fleet.agents[node].client.request("GET", "/v1/facts")[1]["components"]["driver"] == FIXED
        assert Node.objects.get(name=node).component_versions()["driver"] == FIXED
    moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done)}
    assert sorted(moves) == ["ml/trainer-a", "ml/trainer-b"]
    for ref, move in moves.items():
        assert move.state == MoveState.RESTORED and move.target_node.name in ("n2", "n3")
        namespace, name = move.new_workload_ref.split("/")
        replacement = fleet.api.get("pods", name, namespace)
        assert replacement["spec"]["nodeName"] == move.target_node.name
        assert replacement["metadata"]["annotations"]["gpusweep.io/restore-from"] == move.checkpoint_id
        # The original went only after its replacement ran, and through the Eviction API.
        ran = fleet.api.happened("pod-running", move.new_workload_ref)[0][0]
        evicted = fleet.api.happened("evicted", ref)[0][0]
        assert ran < evicted and fleet.api.get("pods", ref.split("/")[1], "ml") is None
    # The CRIU pod was restored INTO its replacement's container: the replacement runs the placeholder, and the
    # restored process is in the cgroup of the container the pod's status names (the test kubelet's containers
    # share the host's namespaces; agent/tests/test_agent_container_restore.py checks real ones).
    move = moves["ml/trainer-b"]
    replacement = fleet.api.get("pods", move.new_workload_ref.split("/")[1], "ml")
    assert replacement["spec"]["containers"][0]["command"][1:] == ["--hold"]
    assert replacement["metadata"]["annotations"]["gpusweep.io/restore-into"] == "main"
    container_id = replacement["status"]["containerStatuses"][0]["containerID"].split("://")[1]
    restored_pid = fleet.agents[move.target_node.name].client.request(
        "GET", f"/v1/checkpoints/{move.checkpoint_id}")[1]["restored"]["pid"]
    assert container_id in Path(f"/proc/{restored_pid}/cgroup").read_text()
    for log in logs.values():
        at_end = len(helpers.steps(log))
        after = helpers.wait_steps(log, at_end + 5)
        assert after == list(range(1, len(after) + 1)), "the counter restarted, skipped or repeated a step"
    checkpointed = {e.data["workload"]: e.data["checkpoint_id"]
                    for e in EvidenceEvent.objects.filter(campaign=done, kind="checkpointed")}
    restored = {e.data["workload"]: e.data["new_id"] for e in EvidenceEvent.objects.filter(campaign=done,
                                                                                          kind="restored")}
    assert checkpointed == {"trainer-a": moves["ml/trainer-a"].checkpoint_id,
                            "trainer-b": moves["ml/trainer-b"].checkpoint_id}
    assert restored == {"trainer-a": moves["ml/trainer-a"].new_workload_ref,
                        "trainer-b": moves["ml/trainer-b"].new_workload_ref}


def test_a_blocking_disruption_budget_fails_its_node_uncordoned_and_the_campaign_goes_on(tmp_path: Path) -> None:
    """Done-when 2: the budget holds n0 until the eviction deadline; n0 fails, is uncordoned, its pod
    never stopped; n1 is patched; the campaign completes within its error budget of 1."""
    with KubeFleet(tmp_path, ["n0", "n1", "n2"], options={"eviction_deadline_s": 3, "eviction_wait_s": 1}) as fleet:
        log = tmp_path / "counter.log"
        fleet.counter_pod("ml", "server", "n0", "signal", log, labels={"app": "server"})
        fleet.api.put("poddisruptionbudgets", pdb("ml", "server", {"app": "server"}, max_unavailable=0))
        fleet.helpers.wait_steps(log, 3)
        fleet.make_cluster()
        done = drive(campaign(["n0", "n1"], error_budget="1").pk)
        assert done.status == CampaignStatus.COMPLETED, done.status_reason
        states = dict(NodeSweep.objects.filter(campaign=done).values_list("node__name", "state"))
        assert states == {"n0": SweepState.FAILED, "n1": SweepState.DONE}
        failed = NodeSweep.objects.get(campaign=done, node__name="n0")
        assert "PodDisruptionBudget" in failed.error
        refusals = fleet.api.happened("eviction-refused", "ml/server")
        assert refusals[-1][0] - refusals[0][0] >= 2.5, "the node was held until the deadline"
        assert untouched(fleet, "n0") and untouched(fleet, "n1")
        assert fleet.agents["n0"].client.request("GET", "/v1/health")[1]["maintenance"] is False
        server = fleet.api.get("pods", "server", "ml")
        assert server["status"]["phase"] == "Running" and server["status"]["containerStatuses"][0][
            "restartCount"] == 0
        before = len(fleet.helpers.steps(log))
        assert len(fleet.helpers.wait_steps(log, before + 3)) > before


def test_an_abort_leaves_no_node_cordoned_or_tainted(tmp_path: Path) -> None:
    with KubeFleet(tmp_path, ["n0", "n1", "n2"], agents=False, connection={"driver_management": "gpu-operator"}) \
            as fleet:
        fleet.api.mutate("nodes", "n1", "", lambda n: n["spec"].update(unschedulable=True))  # an admin's
        fleet.make_cluster()
        made = campaign(["n0", "n1"])
        engine.dispatch(made.pk)
        for sweep in NodeSweep.objects.filter(campaign=made, state=SweepState.DRAINING):
            engine.advance(sweep.pk, max_steps=1)
        assert fleet.api.get("nodes", "n0")["spec"]["unschedulable"] is True
        services.abort(made.pk, None, "operator changed their mind")
        done = drive(made.pk)
        assert done.status == CampaignStatus.ABORTED
        assert set(NodeSweep.objects.filter(campaign=made).values_list("state", flat=True)) <= {
            SweepState.ROLLED_BACK, SweepState.SKIPPED}
        assert untouched(fleet, "n0")
        n1 = fleet.api.get("nodes", "n1")
        assert n1["spec"]["unschedulable"] is True and not n1["spec"].get("taints"), "the admin's cordon stays"


def test_an_abort_after_the_checkpoint_brings_the_work_home_in_its_own_pod(tmp_path: Path) -> None:
    """Rolled back between checkpoint and migration: the node leaves maintenance and the original
    pod's restarting container restores its own checkpoint; no replacement is made."""
    with KubeFleet(tmp_path, ["n0", "n1"]) as fleet:
        log = tmp_path / "counter.log"
        fleet.counter_pod("ml", "trainer", "n0", "signal", log)
        fleet.helpers.wait_steps(log, 3)
        fleet.make_cluster()
        made = campaign(["n0"])
        engine.dispatch(made.pk)
        sweep = NodeSweep.objects.get(campaign=made)
        engine.advance(sweep.pk, max_steps=2)
        assert NodeSweep.objects.get(pk=sweep.pk).state == SweepState.MIGRATING
        stopped_at = len(fleet.helpers.steps(log))
        services.abort(made.pk, None, "window closed")
        done = drive(made.pk)
        assert NodeSweep.objects.get(pk=sweep.pk).state == SweepState.ROLLED_BACK, done.status_reason
        assert untouched(fleet, "n0")
        move = WorkloadMove.objects.get(sweep=sweep)
        assert move.state == MoveState.RETURNED and move.new_workload_ref == "ml/trainer"
        pod = fleet.api.get("pods", "trainer", "ml")
        assert "gpusweep.io/checkpoint-id" not in pod["metadata"]["labels"] and pod["status"]["containerStatuses"][
            0]["restartCount"] >= 1
        assert [p["metadata"]["name"] for p in fleet.api.objects("pods", "ml")] == ["trainer"]
        after = fleet.helpers.wait_steps(log, stopped_at + 3)
        assert after == list(range(1, len(after) + 1)), "the counter did not go on from its checkpoint"


def test_the_gpu_operator_upgrades_only_the_nodes_gpusweep_releases_in_plan_order(tmp_path: Path) -> None:
    """Done-when 3: skip labels hold every node until its turn; the operator's upgrade state is
    followed to done, or to failed (n2 here), which fails that node's sweep."""
    names = ["n0", "n1", "n2", "n3", "n4"]
    with KubeFleet(tmp_path, names, agents=False, driver=OLD,
                   connection={"driver_management": "gpu-operator"}, options={"upgrade_wait_s": 20}) as fleet:
        fleet.api.put("clusterpolicies", cluster_policy(OLD, max_parallel=0))
        operator = GpuOperator(fleet.api, fail_nodes={"n2"})
        wait_for(lambda: all(fleet.api.get("nodes", n)["metadata"]["labels"].get(STATE) == "upgrade-done"
                             for n in names), 10, 0.1)
        fleet.make_cluster()
        made = campaign(["n0", "n1", "n2", "n3"], error_budget="1")
        waves: dict[int, set[str]] = {}
        for wave, name in NodeSweep.objects.filter(campaign=made).values_list("wave", "node__name"):
            waves.setdefault(wave, set()).add(name)
        planned = [waves[w] for w in sorted(waves)]
        done = drive(made.pk)
        assert done.status == CampaignStatus.COMPLETED, done.status_reason
        states = dict(NodeSweep.objects.filter(campaign=made).values_list("node__name", "state"))
        assert states == {"n0": "done", "n1": "done", "n2": "failed", "n3": "done"}
        assert "upgrade-failed" in NodeSweep.objects.get(campaign=made, node__name="n2").error
        started = operator.started("")
        by_wave, at = [], 0
        for wave in planned:
            by_wave.append(set(started[at:at + len(wave)]))
            at += len(wave)
        assert by_wave == planned and at == len(started), f"the operator upgraded {started}; the waves: {planned}"
        assert operator.max_in_progress <= 2
        policy = fleet.api.get("clusterpolicies", "cluster-policy")
        assert policy["spec"]["driver"]["version"] == FIXED
        for name in ("n0", "n1", "n3"):
            node = fleet.api.get("nodes", name)
            assert node["metadata"]["labels"][STATE] == "upgrade-done" and untouched(fleet, name)
            assert Node.objects.get(name=name).component_versions()["driver"] == FIXED
        # The node outside the campaign keeps gpusweep's skip label: its work was never moved.
        n4 = fleet.api.get("nodes", "n4")
        assert n4["metadata"]["labels"][SKIP] == "true" and n4["metadata"]["labels"][STATE] == "upgrade-required"
        assert "n4" not in operator.started("")


def test_a_gpu_operator_campaign_moves_the_gpu_pods_first_and_each_node_gets_its_driver_pod_back(
        tmp_path: Path) -> None:
    """Issue 27, done-when 1: the operator runs its driver, device plugin and validator as DaemonSet pods
    with the chart's default tolerations (only nvidia.com/gpu). gpusweep cordons n0 and n1 without a
    taint of its own, checkpoints their GPU pods and restores them on the spare n2 before the operator's
    state machine reaches pod deletion; the operator deletes each node's old driver pod, the DaemonSet
    brings the new one back, the state reaches upgrade-done, and gpusweep never wrote the state label."""
    with KubeFleet(tmp_path, ["n0", "n1", "n2"], driver=OLD, connection={"driver_management": "gpu-operator"},
                   options={"upgrade_wait_s": 20}) as fleet:
        api, helpers = fleet.api, fleet.helpers
        api.put("clusterpolicies", cluster_policy(OLD, max_parallel=0))
        operator = GpuOperator(api)
        assert wait_for(lambda: all(operator.operand_pod(n, "nvidia-operator-validator") and api.get(
            "nodes", n)["metadata"]["labels"].get(STATE) == "upgrade-done" for n in ("n0", "n1", "n2")), 15, 0.1)
        logs = {"n0": tmp_path / "counter-a.log", "n1": tmp_path / "counter-b.log"}
        fleet.counter_pod("ml", "trainer-a", "n0", "signal", logs["n0"])
        fleet.counter_pod("ml", "trainer-b", "n1", "signal", logs["n1"])
        for log in logs.values():
            helpers.wait_steps(log, 3)
        fleet.make_cluster()
        done = drive(campaign(["n0", "n1"]).pk)
        assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
            NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
        moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done)}
        assert sorted(moves) == ["ml/trainer-a", "ml/trainer-b"]
        for node, ref in (("n0", "ml/trainer-a"), ("n1", "ml/trainer-b")):
            labels = api.get("nodes", node)["metadata"]["labels"]
            assert labels[STATE] == "upgrade-done" and untouched(fleet, node)
            assert Node.objects.get(name=node).component_versions()["driver"] == FIXED
            driver = operator.operand_pod(node, "nvidia-driver-daemonset")
            assert driver is not None and driver["spec"]["containers"][0]["image"].endswith(f":{FIXED}")
            assert driver["status"]["phase"] == "Running"
            # Moved first: the replacement ran on the spare before the operator reached pod deletion.
            move = moves[ref]
            assert move.state == MoveState.RESTORED and move.target_node.name == "n2"
            ran = api.happened("pod-running", move.new_workload_ref)[0][0]
            deletion = api.happened("upgrade-state", f"{node} pod-deletion-required")[0][0]
            assert ran < deletion < api.happened("driver-pod-deleted")[-1][0]
        assert sorted(operator.driver_restarts) == ["n0", "n1"] and operator.deleted_pods == []
        # The spare outside the campaign keeps its old driver pod (held by gpusweep's skip label).
        spare = operator.operand_pod("n2", "nvidia-driver-daemonset")
        assert spare is not None and spare["spec"]["containers"][0]["image"].endswith(f":{OLD}")
        assert not [w for w in api.writes if STATE.encode() in w[2]], "gpusweep wrote the operator's state label"
        for log in logs.values():
            after = helpers.wait_steps(log, len(helpers.steps(log)) + 3)
            assert after == list(range(1, len(after) + 1)), "the counter restarted, skipped or repeated a step"


def test_pods_without_a_gpu_request_that_the_agent_finds_holding_a_gpu_are_moved_or_stopped_by_the_policy(
        tmp_path: Path) -> None:
    """Issue 19, item 6: neither pod asks for nvidia.com/gpu, so the scheduler never reports them; each
    node's agent finds it holding the node's (stand-in) GPU, ml/sneaky by the workload id its gpusweep-run
    registered, ml/bystander by its cgroup's pod UID, as kubelet places a container. The engine treats them
    as it treats declared GPU pods: sneaky (policy checkpoint, signal engine) is checkpointed through the
    agent and goes on in its replacement on the spare; bystander (cold_restart, no engine) is stopped, a
    fresh copy started by gpusweep (a bare pod has no controller). The evidence says who found them."""
    ok, reason = cgroups_writable()
    need(ok, reason)
    python = sys.executable
    with KubeFleet(tmp_path, ["n0", "n1", "n2"],
                   agent_settings={"gpu_devices": str(tmp_path / "dev-{node}" / "nvidia[0-9]*")}) as fleet:
        devices = {}
        for name in ("n0", "n1", "n2"):
            devices[name] = tmp_path / f"dev-{name}" / "nvidia0"
            devices[name].parent.mkdir()
            devices[name].write_text("")
        log = tmp_path / "sneaky.log"
        fleet.counter_pod("ml", "sneaky", "n0", "signal", log, gpus=0, holds=devices["n0"])
        fleet.api.put("pods", gpu_pod("ml", "bystander", "n1", 0,
                                      command=[python, str(HOLDER), str(devices["n1"]), "sleep", "600"]))
        fleet.helpers.wait_steps(log, 3)
        uid = fleet.api.get("pods", "bystander", "ml")["metadata"]["uid"]
        container = wait_for(lambda: fleet.kubelets["n1"].containers.get((uid, "main")), 10, 0.1)
        assert container is not None and container.proc is not None
        with in_cgroup(container.proc.pid, f"/kubepods/besteffort/pod{uid}/{'ab' * 32}"):
            fleet.make_cluster()
            assert not Workload.objects.filter(scheduler_id__in=["ml/sneaky", "ml/bystander"]).exists(), \
                "the scheduler reports neither as a GPU workload"
            made = campaign(["n0", "n1"], workload_overrides={"bystander": "cold_restart"})
            made.refresh_from_db()
            assert made.approved_plan is not None
            shown = {e["name"]: {u["owner"]["id"] or u["name"]: u for u in e["users"]}
                     for e in made.approved_plan.content["unreported_gpu_users"]}
            assert shown["n1"]["ml/bystander"]["action"] == "stop it", shown
            assert shown["n0"]["ml/sneaky"]["action"] == "checkpoint it", shown
            done = drive(made.pk)
        assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
            NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
        moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done).select_related(
            "target_node")}
        assert sorted(moves) == ["ml/bystander", "ml/sneaky"]
        # sneaky: checkpointed and restored on the spare, where its counter goes on from its step.
        sneaky = moves["ml/sneaky"]
        assert sneaky.state == MoveState.RESTORED and sneaky.target_node is not None
        assert sneaky.target_node.name == "n2" and sneaky.gpus == 1
        namespace, name = sneaky.new_workload_ref.split("/")
        assert fleet.api.get("pods", name, namespace)["spec"]["nodeName"] == "n2"
        assert fleet.api.get("pods", "sneaky", "ml") is None
        after = fleet.helpers.wait_steps(log, len(fleet.helpers.steps(log)) + 5)
        assert after == list(range(1, len(after) + 1)), "the counter restarted, skipped or repeated a step"
        # bystander: stopped (evicted), its fresh copy started by gpusweep.
        assert moves["ml/bystander"].state == MoveState.STOPPED
        assert fleet.api.get("pods", "bystander", "ml") is None and fleet.api.happened("evicted", "ml/bystander")
        [copy] = [p for p in fleet.api.objects("pods", "ml")
                  if p["metadata"]["annotations"].get("gpusweep.io/replaces") == "ml/bystander"]
        assert copy["spec"].get("nodeName") == "n2"
        events = {e.kind: e.data for e in EvidenceEvent.objects.filter(campaign=done,
                                                                       kind__in=["checkpointed", "stopped"])}
        assert events["checkpointed"]["workload"] == "sneaky" and events["stopped"]["workload"] == "bystander"
        assert events["checkpointed"]["origin"] == events["stopped"]["origin"] == UNDECLARED
        for node in ("n0", "n1"):
            assert untouched(fleet, node)


def test_gpu_processes_in_no_pod_are_checkpointed_stopped_or_waited_for_and_a_daemonset_pod_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19, item 6: three processes started on the host by hand, in no pod, each hold their node's
    (stand-in) GPU; the agents list them as workloads (gpu-pid-<pid>) and the engine acts on each by policy
    through the agent: on n0 (checkpoint) the cuda engine (a stand-in libcuda, real CRIU) saves it and n3's
    agent restores it from the shared store, its GPU descriptor with it; on n1 (cold_restart) it is stopped
    and nobody starts it again; n2 (wait) is patched after its process ends. A DaemonSet's pod holding n1's
    GPU is planned as staying on its node (the reboot restarts it) and is left running there."""
    ok, reason = cgroups_writable()
    need(ok, reason)
    helpers = agent_helpers()
    need(helpers.criu_usable(), helpers.CRIU_HINT)
    need(shutil.which("gcc") is not None, "needs gcc (apt-get install build-essential)")
    standin = tmp_path / "libcuda-standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(standin), str(helpers.DATA / "libcuda_standin.c")],
                   check=True)
    monkeypatch.setattr(policy, "WAIT_POLL_S", 1.0)
    python = sys.executable
    devices = {name: tmp_path / f"dev-{name}" / "nvidia0" for name in ("n0", "n1", "n2", "n3")}
    for device in devices.values():
        device.parent.mkdir()
        device.write_text("")

    def hold(node: str, seconds: int) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([python, str(HOLDER), str(devices[node]), "sleep", str(seconds)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        # Reaped the moment it is stopped: CRIU restores a process under its own pid, which must be free.
        threading.Thread(target=proc.wait, daemon=True).start()
        return proc

    with KubeFleet(tmp_path, ["n0", "n1", "n2", "n3"],
                   agent_settings={"gpu_devices": str(tmp_path / "dev-{node}" / "nvidia[0-9]*"),
                                   "libcuda": str(standin)}) as fleet:
        moved, stopped, waited = hold("n0", 600), hold("n1", 600), hold("n2", 25)
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-exporter",
                 "uid": "5d1c9a5e-0000-4000-8000-00000000da05"}
        fleet.api.put("pods", gpu_pod("kube-system", "gpu-exporter-n1", "n1", 0, owner=owner,
                                      command=[python, str(HOLDER), str(devices["n1"]), "sleep", "600"]))
        uid = fleet.api.get("pods", "gpu-exporter-n1", "kube-system")["metadata"]["uid"]
        container = wait_for(lambda: fleet.kubelets["n1"].containers.get((uid, "main")), 10, 0.1)
        assert container is not None and container.proc is not None
        daemon = container.proc
        expected = {moved.pid: "n0", stopped.pid: "n1", waited.pid: "n2", daemon.pid: "n1"}
        wait_for(lambda: all(pid in device_holders([str(devices[node])]) for pid, node in expected.items()), 10, 0.1)
        bare = {f"gpu-pid-{p.pid}" for p in (moved, stopped, waited)}
        restored_pid = 0
        try:
            with in_cgroup(daemon.pid, f"/kubepods/besteffort/pod{uid}/{'cd' * 32}"):
                fleet.make_cluster()
                made = campaign(["n0", "n1", "n2"], parallelism_per_cluster="3", workload_overrides={
                    f"gpu-pid-{stopped.pid}": "cold_restart", f"gpu-pid-{waited.pid}": "wait"})
                made.refresh_from_db()
                assert made.approved_plan is not None
                shown = {(e["name"], u["pid"]): u["action"] for e in made.approved_plan.content["unreported_gpu_users"]
                         for u in e["users"]}
                assert shown == {
                    ("n0", moved.pid): "checkpoint it", ("n1", stopped.pid): "stop it",
                    ("n2", waited.pid): "wait for it to end",
                    ("n1", daemon.pid): "a DaemonSet's pod: stays on its node, and the reboot restarts it"}, shown
                done = drive_until_rest(made.pk, timeout=150)
                assert done.status == CampaignStatus.COMPLETED, (done.status_reason, list(
                    NodeSweep.objects.filter(campaign=done).values_list("node__name", "state", "error")))
                moves = {m.workload_ref: m for m in WorkloadMove.objects.filter(sweep__campaign=done)
                         .select_related("target_node")}
                assert set(moves) == bare, ("the DaemonSet's pod is no workload gpusweep acts on", {
                    r: (m.sweep.node.name, m.workload_name, m.state) for r, m in moves.items()}, daemon.poll(),
                    fleet.api.happened("container-started"))
                # n0's process: checkpointed by the cuda engine, restored on the spare by its agent, still holding
                # the descriptor it had (CRIU reopens the file).
                move = moves[f"gpu-pid-{moved.pid}"]
                assert move.state == MoveState.RESTORED and move.target_node is not None
                assert move.target_node.name == "n3" and move.gpus == 1
                assert move.new_workload_ref == f"gpu-pid-{moved.pid}" and moved.poll() is not None
                [listed] = [w for w in fleet.workloads("n3") if w["id"] == move.new_workload_ref]
                restored_pid = int(listed["pid"])
                assert listed["state"] == "running" and listed["kind"] == "gpu_process"
                assert restored_pid in device_holders([str(devices["n0"])])
                assert Path(f"/proc/{restored_pid}").exists()
                # n1's: stopped; n2's: ran to its end, which n2's patch came after.
                assert moves[f"gpu-pid-{stopped.pid}"].state == MoveState.STOPPED and stopped.poll() is not None
                assert moves[f"gpu-pid-{waited.pid}"].state == MoveState.FINISHED and waited.returncode == 0
                # The DaemonSet's pod was left running on its node.
                assert daemon.poll() is None, (daemon.returncode, fleet.api.happened("container-started"),
                                               fleet.api.happened("evicted"))
                assert fleet.api.get("pods", "gpu-exporter-n1", "kube-system")["spec"]["nodeName"] == "n1"
        finally:
            for proc in (moved, stopped, waited):
                if proc.poll() is None:
                    proc.kill()
            if restored_pid:
                helpers.kill_pid(restored_pid)
        events = EvidenceEvent.objects.filter(campaign=done)
        [checkpointed] = [e.data for e in events.filter(kind="checkpointed")]
        [stop] = [e.data for e in events.filter(kind="stopped")]
        [finished] = [e.data for e in events.filter(kind="finished")]
        waits = [e.data for e in events.filter(kind="waiting")]
        assert checkpointed["engine"] == "cuda" and stop["restarted_by"] == "nobody: its owner must start it again"
        assert waits and all(w["origin"] == UNDECLARED for w in waits)
        assert checkpointed["origin"] == stop["origin"] == finished["origin"] == UNDECLARED
        # n2 was patched only once the engine saw its process end, having waited for it.
        sweep = NodeSweep.objects.get(campaign=done, node__name="n2")
        ended = events.get(kind="finished", sweep=sweep).at
        assert sweep.patched_at is not None and sweep.patched_at > ended > events.filter(
            kind="waiting", sweep=sweep).earliest("at").at
        for node in ("n0", "n1", "n2"):
            assert untouched(fleet, node)
