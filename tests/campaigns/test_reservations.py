"""The plan lists each wave's maintenance reservations (executors.base.Executor.wave_reservation):
one per cluster whose back end holds one, with that wave's nodes and the plan's time for it, on the
plan page too. Real planner, real database rows, the real Slurm executor object (listing a
reservation asks Slurm nothing; creating one is tested on a real Slurm cluster in
tests/campaigns/test_slurm_campaign.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.template.loader import render_to_string

from campaigns import board, policy, services
from campaigns.planner import PlanNode, Policy, plan
from executors.base import get_executor
from inventory.models import Cluster, Node

pytestmark = pytest.mark.django_db
MONDAY = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_the_plan_lists_per_wave_the_reservation_of_each_cluster_that_holds_one() -> None:
    slurm = Cluster.objects.create(name="hpc", kind="slurm", connection={
        "executor": "slurm", "executor_options": {"maintenance_reservation": "wave"}})
    other = Cluster.objects.create(name="lab", kind="static", connection={"executor": "memory"})
    nodes = [Node.objects.create(cluster=slurm, name=f"gpu0{i}", gpu_count=8) for i in (1, 2, 3)]
    nodes.append(Node.objects.create(cluster=other, name="box1", gpu_count=8))
    scope = [PlanNode(id=n.pk, name=n.name, cluster=n.cluster.name, pool="", gpu_model="H100", gpu_count=8,
                      versions={"driver": "570.86.15"}, target={"driver": "570.195.03"}) for n in nodes]
    content = plan(scope, [], Policy(start=MONDAY, per_cluster="2", node_seconds=3600))
    executors = {c.name: get_executor(c) for c in (slurm, other)}
    services.add_reservations(content, 42, {n.pk: n for n in nodes}, executors)

    listed = {w["wave"]: [(r["cluster"], r["name"], r["nodes"]) for r in w["reservations"]] for w in content["waves"]}
    first = sorted(n.name for n in nodes if n.pk in content["waves"][0]["nodes"] and n.cluster == slurm)
    second = sorted(n.name for n in nodes if n.pk in content["waves"][1]["nodes"] and n.cluster == slurm)
    assert listed == {1: [("hpc", "gpusweep-c42-w1", first)], 2: [("hpc", "gpusweep-c42-w2", second)]}
    assert len(first) == 2 and len(second) == 1, "only that wave's nodes, only the cluster that reserves"
    # The plan's hour for the wave plus the margin.
    assert {r["minutes"] for w in content["waves"] for r in w["reservations"]} == {60 + 30}
    assert content["summary"]["reservations"] == 2

    page = render_to_string("campaigns/_plan.html", {"plan_view": board.plan_view(content, None, [])})
    assert f"Maintenance reservation <code>gpusweep-c42-w1</code> on hpc: {', '.join(first)}" in page
    assert f"Maintenance reservation <code>gpusweep-c42-w2</code> on hpc: {second[0]}" in page
    assert "on lab" not in page


def test_a_reservation_lasts_to_the_planned_end_of_its_wave_plus_the_margin() -> None:
    start, end = MONDAY, MONDAY + timedelta(hours=2)
    assert policy.reservation_minutes(start, end, MONDAY - timedelta(minutes=10)) == 130 + 30  # admitted early
    assert policy.reservation_minutes(start, end, MONDAY + timedelta(hours=3)) == 120 + 30  # late: its duration
    assert policy.reservation_minutes(None, None, MONDAY) == 30


def test_an_unknown_reservation_kind_is_refused() -> None:
    cluster = Cluster.objects.create(name="hpc", kind="slurm", connection={
        "executor": "slurm", "executor_options": {"maintenance_reservation": "weekly"}})
    with pytest.raises(ImproperlyConfigured, match="maintenance_reservation 'weekly'"):
        get_executor(cluster)


def test_a_node_fixed_by_a_livepatch_is_in_no_reservation() -> None:
    """Its work keeps running and it keeps taking more (issue 30): a maintenance reservation would
    stop the scheduler from placing any job there."""
    slurm = Cluster.objects.create(name="hpc", kind="slurm", connection={
        "executor": "slurm", "executor_options": {"maintenance_reservation": "wave"}})
    nodes = [Node.objects.create(cluster=slurm, name=f"gpu0{i}", gpu_count=8) for i in (1, 2)]
    targets = {nodes[0].pk: {"livepatch": "66"}, nodes[1].pk: {"kernel": "5.15.0-1073-nvidia"}}
    scope = [PlanNode(id=n.pk, name=n.name, cluster="hpc", gpu_count=8, versions={"kernel": "5.15.0-1042-nvidia"},
                      target=targets[n.pk]) for n in nodes]
    content = plan(scope, [], Policy(start=MONDAY, per_cluster="2", node_seconds=3600))
    services.add_reservations(content, 7, {n.pk: n for n in nodes}, {"hpc": get_executor(slurm)})
    [wave] = content["waves"]
    assert [r["nodes"] for r in wave["reservations"]] == [["gpu02"]]
