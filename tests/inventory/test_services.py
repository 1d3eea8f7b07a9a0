from __future__ import annotations

import datetime as dt

import pytest

from inventory.choices import ChangeAction, ClusterKind, ServiceState, WorkloadKind
from inventory.models import ChangeLog, Cluster, Node, NodeComponent, Workload
from inventory.services import InventoryError, ObservedNode, ObservedWorkload, Snapshot, apply_snapshot
from inventory.signals import node_versions_changed

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="lab", kind=ClusterKind.STATIC)


@pytest.fixture
def signalled():
    calls: list[list[int]] = []

    def receiver(sender, node_ids, **kwargs):
        calls.append(list(node_ids))

    node_versions_changed.connect(receiver, weak=False)
    yield calls
    node_versions_changed.disconnect(receiver)


def fleet(driver_of_b: str = "570.86.15") -> Snapshot:
    return Snapshot(
        nodes=[
            ObservedNode("a", components={"driver": "570.86.15", "cuda": "12.8"}, gpu_model="H100", gpu_count=8),
            ObservedNode("b", components={"driver": driver_of_b, "cuda": "12.8"}, gpu_model="H100", gpu_count=8),
        ],
        workloads=[ObservedWorkload(WorkloadKind.PROCESS, "wl-1", node="a", gpus=2)],
        replace_components=True,
    )


def test_it_creates_nodes_components_and_workloads_and_logs_them(cluster, signalled):
    result = apply_snapshot(cluster, fleet(), "file")
    assert (result.added, result.changed, result.removed, result.workloads_added) == (2, 0, 0, 1)
    node = Node.objects.get(cluster=cluster, name="a")
    assert node.component_versions() == {"driver": "570.86.15", "cuda": "12.8"}
    assert NodeComponent.objects.get(node=node, component="driver").branch == "R570"
    assert Workload.objects.get(scheduler_id="wl-1").node == node
    assert ChangeLog.objects.filter(action=ChangeAction.CREATE, object_type="node").count() == 2
    assert len(signalled) == 1 and len(signalled[0]) == 2


def test_it_changes_nothing_when_the_same_snapshot_comes_twice(cluster, signalled):
    apply_snapshot(cluster, fleet(), "file")
    logs = ChangeLog.objects.count()
    again = apply_snapshot(cluster, fleet(), "file")
    assert again.no_changes
    assert again.unchanged == 2
    assert ChangeLog.objects.count() == logs
    assert len(signalled) == 1  # only the first run changed versions


def test_it_hands_on_only_nodes_whose_versions_changed(cluster, signalled):
    apply_snapshot(cluster, fleet(), "file")
    result = apply_snapshot(cluster, fleet(driver_of_b="570.195.03"), "file")
    b = Node.objects.get(name="b")
    assert result.changed == 1
    assert result.versions_changed == {b.pk}
    assert signalled[-1] == [b.pk]
    entry = ChangeLog.objects.filter(object_id=b.pk, action=ChangeAction.UPDATE).get()
    assert entry.changes == {"component:driver": ["570.86.15", "570.195.03"]}
    assert entry.source == "file"


def test_it_marks_vanished_nodes_and_workloads_gone_and_brings_them_back(cluster):
    apply_snapshot(cluster, fleet(), "file")
    only_b = Snapshot(nodes=[fleet().nodes[1]], workloads=[], replace_components=True)
    result = apply_snapshot(cluster, only_b, "file")
    a = Node.objects.get(name="a")
    assert (result.removed, result.workloads_removed) == (1, 1)
    assert a.service_state == ServiceState.GONE and a.gone_at is not None
    assert Workload.objects.get(scheduler_id="wl-1").gone_at is not None
    back = apply_snapshot(cluster, fleet(), "file")
    a.refresh_from_db()
    assert back.changed == 1 and a.service_state == ServiceState.IN_SERVICE and a.gone_at is None
    # A requeued job comes back under the same id: the row is revived, not duplicated.
    assert back.workloads_changed == 1 and Workload.objects.get(scheduler_id="wl-1").gone_at is None


def test_it_merges_components_when_a_source_reports_only_some(cluster):
    apply_snapshot(cluster, fleet(), "file")
    partial = Snapshot(nodes=[ObservedNode("a", components={"driver": "580.95.05"})], complete=False)
    apply_snapshot(cluster, partial, "slurm")
    a = Node.objects.get(name="a")
    assert a.component_versions() == {"driver": "580.95.05", "cuda": "12.8"}
    assert a.gpu_model == "H100"  # not reported by the partial source: left alone
    assert Node.objects.get(name="b").service_state == ServiceState.IN_SERVICE  # not complete: nothing gone


def test_a_partial_snapshot_leaves_other_nodes_and_the_cluster_sync_time_alone(cluster):
    apply_snapshot(cluster, fleet(), "file")
    synced = Cluster.objects.get(pk=cluster.pk).last_synced_at
    heartbeat = Snapshot(nodes=[ObservedNode("c", components={"driver": "580.95.05"})], workloads=[],
                         complete=False, workload_kinds=frozenset({WorkloadKind.PROCESS}))
    result = apply_snapshot(cluster, heartbeat, "agent")
    assert (result.added, result.removed, result.workloads_removed) == (1, 0, 0)
    assert Workload.objects.get(scheduler_id="wl-1").gone_at is None  # on node a, not in scope
    assert Cluster.objects.get(pk=cluster.pk).last_synced_at == synced


def test_it_leaves_a_patching_node_to_its_campaign(cluster):
    apply_snapshot(cluster, fleet(), "file")
    Node.objects.filter(name="a").update(service_state=ServiceState.PATCHING)
    snapshot = fleet()
    snapshot.nodes[0].service_state = ServiceState.DRAINING
    apply_snapshot(cluster, snapshot, "slurm")
    assert Node.objects.get(name="a").service_state == ServiceState.PATCHING


def test_it_refuses_a_duplicate_node_and_writes_nothing(cluster):
    snapshot = Snapshot(nodes=[ObservedNode("a", origin="row 2"), ObservedNode("a", origin="row 3")])
    with pytest.raises(InventoryError, match="row 3: duplicate node 'a'"):
        apply_snapshot(cluster, snapshot, "file")
    assert Node.objects.count() == 0 and ChangeLog.objects.count() == 0


def test_it_stores_unknown_versions_raw_and_flagged(cluster):
    apply_snapshot(cluster, Snapshot(nodes=[ObservedNode("a", components={"driver": "570.x-custom"})]), "file")
    component = NodeComponent.objects.get()
    assert component.version == "570.x-custom" and component.flagged and component.branch == ""


def test_it_records_workload_changes(cluster):
    apply_snapshot(cluster, fleet(), "file")
    snapshot = fleet()
    assert snapshot.workloads is not None
    snapshot.workloads[0].time_limit = dt.timedelta(hours=2)
    result = apply_snapshot(cluster, snapshot, "file")
    assert result.workloads_changed == 1
    assert Workload.objects.get().time_limit == dt.timedelta(hours=2)


def test_set_service_state_logs_only_real_changes(cluster):
    from inventory.services import set_service_state

    apply_snapshot(cluster, fleet(), "file")
    ids = list(Node.objects.values_list("id", flat=True))
    assert set_service_state(ids, ServiceState.PATCHING, "campaign", "campaign 1, sweep 2") == 2
    assert set_service_state(ids, ServiceState.PATCHING, "campaign") == 0
    logs = ChangeLog.objects.filter(source="campaign")
    assert logs.count() == 2
    assert {log.reference for log in logs} == {"campaign 1, sweep 2"}
    assert {tuple(log.changes["service_state"]) for log in logs} == {("in_service", "patching")}
    with pytest.raises(InventoryError, match="unknown service state"):
        set_service_state(ids, "asleep", "campaign")


def test_record_versions_logs_the_change_and_tells_the_exposures(cluster, django_capture_on_commit_callbacks):
    from inventory.services import record_versions
    from inventory.signals import node_versions_changed

    apply_snapshot(cluster, fleet(), "file")
    node = Node.objects.get(name="a")
    heard = []

    def listener(sender, node_ids, reference="", **kwargs):
        heard.append((list(node_ids), reference))

    node_versions_changed.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            changed = record_versions(node.pk, {"driver": "570.195.03"}, "campaign", "campaign 3, sweep 9")
        with django_capture_on_commit_callbacks(execute=True):
            again = record_versions(node.pk, {"driver": "570.195.03"}, "campaign", "campaign 3, sweep 9")
    finally:
        node_versions_changed.disconnect(listener)
    assert changed == ["driver"] and again == []
    assert heard == [([node.pk], "campaign 3, sweep 9")]
    row = NodeComponent.objects.get(node=node, component="driver")
    assert (row.version, row.branch, row.source) == ("570.195.03", "R570", "campaign")
    log = ChangeLog.objects.get(source="campaign")
    assert log.changes == {"component:driver": ["570.86.15", "570.195.03"]} and log.reference == "campaign 3, sweep 9"
    with pytest.raises(InventoryError):
        record_versions(node.pk, {"driver": "570.1\x00"}, "campaign")


def test_move_workload_records_the_new_place_once(cluster):
    from inventory.services import move_workload

    apply_snapshot(cluster, fleet(), "file")
    workload = Workload.objects.get()
    target = Node.objects.exclude(pk=workload.node_id).get()
    assert move_workload(workload.pk, target.pk, "wl-7", "campaign", "campaign 1, sweep 1")
    assert not move_workload(workload.pk, target.pk, "wl-7", "campaign", "campaign 1, sweep 1")
    workload.refresh_from_db()
    assert (workload.node_id, workload.scheduler_id) == (target.pk, "wl-7")
    assert list(workload.nodes.values_list("pk", flat=True)) == [target.pk]
    assert ChangeLog.objects.filter(source="campaign", object_type="workload").count() == 1


def test_a_scheduler_sync_does_not_overwrite_what_the_agent_read(cluster):
    agent_view = Snapshot(nodes=[ObservedNode("a", components={"driver": "570.86.15", "os": "debian 12"})],
                          complete=False, replace_components=True)
    apply_snapshot(cluster, agent_view, "agent")
    scheduler_view = Snapshot(nodes=[ObservedNode("a", components={"os": "Debian GNU/Linux 12 (bookworm)",
                                                                   "cuda": "12.8"})])
    result = apply_snapshot(cluster, scheduler_view, "kubernetes")
    a = Node.objects.get(name="a")
    assert a.component_versions() == {"driver": "570.86.15", "os": "debian 12", "cuda": "12.8"}
    assert result.changed_components == {"a": ["cuda"]}
    assert apply_snapshot(cluster, scheduler_view, "kubernetes").no_changes  # no flip-flop between sources
    assert NodeComponent.objects.get(node=a, component="cuda").source == "kubernetes"
    apply_snapshot(cluster, Snapshot(nodes=[ObservedNode("a", components={"os": "debian 13"})], complete=False),
                   "agent")
    assert a.component_versions()["os"] == "debian 13"


def test_a_move_onto_a_row_the_targets_own_source_made_ends_the_old_row(cluster):
    from inventory.services import move_workload

    apply_snapshot(cluster, fleet(), "file")
    workload = Workload.objects.get()
    target = Node.objects.exclude(pk=workload.node_id).get()
    twin = Workload.objects.create(cluster=cluster, node=None, kind=workload.kind, scheduler_id="wl-restored",
                                   gone_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert move_workload(workload.pk, target.pk, "wl-restored", "campaign", "campaign 1, sweep 1")
    workload.refresh_from_db()
    twin.refresh_from_db()
    assert workload.gone_at is not None and workload.scheduler_id == "wl-1"
    assert (twin.node_id, twin.gone_at) == (target.pk, None) and twin.last_seen is not None
    assert list(twin.nodes.values_list("pk", flat=True)) == [target.pk]
    log = ChangeLog.objects.get(source="campaign", object_type="workload")
    assert (log.object_id, log.reference, log.object_repr) == (workload.pk, "campaign 1, sweep 1", "lab/process:wl-1")
    assert log.changes == {"node_id": [Node.objects.get(name="a").pk, target.pk],
                           "scheduler_id": ["wl-1", "wl-restored"], "superseded_by": [None, twin.pk]}


def test_campaign_writes_commit_or_roll_back_with_the_callers_transaction(cluster, signalled):
    from django.db import transaction

    from inventory.services import move_workload, record_versions, set_service_state

    apply_snapshot(cluster, fleet(), "file")
    signalled.clear()
    node = Node.objects.get(name="a")
    workload = Workload.objects.get()
    logs = ChangeLog.objects.count()

    def writes() -> None:
        assert set_service_state([node.pk], ServiceState.DRAINING, "campaign", "campaign 1, sweep 1") == 1
        assert record_versions(node.pk, {"driver": "570.195.03", "fabricmanager": "570.195.03"}, "campaign",
                               "campaign 1, sweep 1") == ["driver", "fabricmanager"]
        assert move_workload(workload.pk, Node.objects.get(name="b").pk, "wl-2", "campaign", "campaign 1, sweep 1")

    with pytest.raises(RuntimeError), transaction.atomic():
        writes()
        raise RuntimeError("the step's transition failed")
    assert ChangeLog.objects.count() == logs and not signalled
    assert Node.objects.get(pk=node.pk).service_state == ServiceState.IN_SERVICE
    assert node.component_versions()["driver"] == "570.86.15"
    assert Workload.objects.get().scheduler_id == "wl-1"
    with transaction.atomic():
        writes()
        assert not signalled  # sent once the transaction commits
    assert signalled == [[node.pk]]
    new = ChangeLog.objects.filter(source="campaign").order_by("pk")
    assert [log.reference for log in new] == ["campaign 1, sweep 1"] * 3
    assert new[1].changes == {"component:driver": ["570.86.15", "570.195.03"],
                              "component:fabricmanager": [None, "570.195.03"]}
    added = NodeComponent.objects.get(node=node, component="fabricmanager")
    assert (added.version, added.source, added.version_key is not None) == ("570.195.03", "campaign", True)
    assert Node.objects.get(pk=node.pk).updated_at > node.updated_at
