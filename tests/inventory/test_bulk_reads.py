"""gpusweep.db.reads.select_rows reads what the ORM's values_list reads, on every engine."""

from __future__ import annotations

import datetime as dt

import pytest

from gpusweep.db.reads import select_rows
from inventory.choices import ClusterKind, WorkloadKind
from inventory.models import Cluster, Node, Workload

pytestmark = pytest.mark.django_db

# Every kind of column the raw readers convert: JSON, times, durations, booleans, nulls.
CLUSTER = ("id", "name", "connection", "sync_enabled", "last_synced_at", "created_at")
NODE = ("id", "name", "labels", "facts", "gpu_count", "memory_mib", "cpu_milli", "gone_at", "last_seen")
WORKLOAD = ("id", "node_id", "kind", "user", "gpus", "started_at", "time_limit", "requires", "gone_at")


def test_select_rows_converts_as_values_list_does():
    when = dt.datetime(2026, 11, 30, 7, 0, 0, 123456, tzinfo=dt.UTC)
    cluster = Cluster.objects.create(name="lab", kind=ClusterKind.STATIC, connection={"url": "x", "n": [1, 2]},
                                     sync_enabled=False, last_synced_at=when)
    node = Node.objects.create(cluster=cluster, name="gpu01", labels={"pool": "a/b"}, facts={"os": "ubuntu"},
                               gpu_count=8, memory_mib=2**40, gone_at=when.replace(microsecond=0))
    Node.objects.create(cluster=cluster, name="gpu02")  # defaults and NULLs
    Workload.objects.create(cluster=cluster, node=node, kind=WorkloadKind.PROCESS, scheduler_id="w1", user="ann",
                            gpus=2, started_at=when, time_limit=dt.timedelta(hours=3, microseconds=5),
                            requires={"driver": "570.86.15"})
    Workload.objects.create(cluster=cluster, kind=WorkloadKind.PROCESS, scheduler_id="w2")
    for model, columns in ((Cluster, CLUSTER), (Node, NODE), (Workload, WORKLOAD)):
        expected = sorted(model.objects.values_list(*columns))
        got = sorted(select_rows(model, columns, "cluster_id = %s" if model is not Cluster else "id = %s",
                                 [cluster.pk]))
        assert got == expected
        assert [[type(v) for v in row] for row in got] == [[type(v) for v in row] for row in expected]
    assert select_rows(Node, ("name",), "name = %s", ["none"]) == []


def _fields(instance):
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


@pytest.mark.parametrize("prepared", [False, True])
def test_select_instances_gives_what_filter_gives(prepared):
    from gpusweep.db.reads import loader, prepared_cursor, select_instances

    when = dt.datetime(2026, 11, 30, 7, 0, 0, 123456, tzinfo=dt.UTC)
    cluster = Cluster.objects.create(name="lab", kind=ClusterKind.STATIC, connection={"url": "x"}, last_synced_at=when)
    node = Node.objects.create(cluster=cluster, name="gpu01", labels={"pool": "a"}, gpu_count=8, gone_at=when)
    Workload.objects.create(cluster=cluster, node=node, kind=WorkloadKind.PROCESS, scheduler_id="w1", gpus=2,
                            time_limit=dt.timedelta(hours=3), requires={"driver": "570.86.15"})
    for model in (Cluster, Node, Workload):
        got = select_instances(model, "id IN (SELECT id FROM " + model._meta.db_table + ")", prepared=prepared)
        assert [_fields(i) for i in got] == [_fields(i) for i in model.objects.order_by("pk")]
        assert all(not i._state.adding for i in got)
    # A deferred column is loaded on first access, as the ORM's defer() does.
    partial = loader(Node, "n", ("labels",))
    with prepared_cursor() as cursor:
        cursor.execute(f"SELECT {partial.select} FROM {Node._meta.db_table} n WHERE n.id = %s", [node.pk])
        built = partial.build(cursor.fetchone())
    assert "labels" in built.get_deferred_fields()
    assert built.labels == {"pool": "a"} and built.name == "gpu01"
