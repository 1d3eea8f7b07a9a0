"""What the README says the demo does (issue 31): the demo fleet's inventory as `demo_fleet`
registers it (the memory back end stands in for its agents), swept as the README's walk-through
sweeps it (pool `batch`, bulletin 5703). The moved counters all go to gpu06, the batch node already
on the fixed driver (outside the sweep, not exposed: the receivers the planner prefers); the two
spare nodes are exposed themselves, so they take nothing and stay exposed after the campaign; a
second campaign over pool `spare` moves their counters to the patched batch nodes."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from advisories.exposure import recompute
from advisories.models import Advisory, Exposure
from campaigns import queue, services
from campaigns.choices import CampaignStatus
from campaigns.management.commands.demo_fleet import CLUSTER, GPU_MODEL, Command
from campaigns.models import WorkloadMove
from executors.memory import Fleet
from inventory.models import Cluster, Node
from tests.advisories.conftest import FIXTURES
from tests.campaigns.fleet import drive, user

pytestmark = pytest.mark.django_db


def test_the_demo_sweep_moves_every_counter_to_the_fixed_batch_node_and_leaves_the_spares_exposed(
        django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
    call_command("ingest_advisories", str(FIXTURES), verbosity=0)
    # Planning asks each node's back end what runs there; the memory back end stands in for the agents.
    fleet = Fleet()
    fleet.reset()
    for index, (name, driver, pool) in enumerate(Command._layout(10)):
        Command._register(name, driver, pool, 17200 + index)
        fleet.add_node(CLUSTER, name, gpu_model=GPU_MODEL, gpu_count=8,
                       versions={"driver": driver, "cuda": "12.8" if driver.startswith("570") else "13.0"})
        fleet.add_workload(CLUSTER, name, f"count-{name}", name=f"counter on {name}", gpus=1, engine="signal")
    Cluster.objects.filter(name=CLUSTER).update(connection={"executor": "memory"})
    recompute()
    advisory = Advisory.objects.get(publisher_id="5703")
    spares = set(Node.objects.filter(cluster__name="demo", pool="spare").values_list("name", flat=True))
    assert spares == {"gpu05", "gpu10"}
    exposed = set(Exposure.objects.filter(advisory=advisory, state="open").values_list("node__name", flat=True))
    assert spares <= exposed and "gpu06" not in exposed  # gpu06 already runs R570's fixed driver

    operator = user("otto", "operator")
    campaign = services.create_campaign(operator, {
        "name": "Patch 5703", "pools": ["batch"], "parallelism_per_cluster": "2", "error_budget": "1",
        "workload_policy": "checkpoint", "canary": "auto", "soak_s": 0, "approvals_required": 1}, [advisory.pk])
    plan = services.make_plan(campaign.pk, operator).content
    names = {int(pk): node["name"] for pk, node in plan["nodes"].items()}
    assert set(names.values()) == {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "gpu08", "gpu09"}
    moves = [m for node in plan["nodes"].values() for m in node["moves"]]
    assert len(moves) == 7 and {m["action"] for m in moves} == {"migrate"}
    assert {m["to_name"] for m in moves} == {"gpu06"}, "the README says where the demo's counters go"
    assert not plan["exposed_receivers"]  # the exposed spares are never needed: nothing offers to add them

    # Run it (the memory back end patches), then sweep the spares: their counters go to patched batch nodes.
    services.approve(campaign.pk, user("anna", "approver"))
    queue.ENQUEUE.insert(0, lambda *args: None)  # no broker: drive() runs the steps
    try:
        services.start(campaign.pk, operator)
    finally:
        queue.ENQUEUE.pop(0)
    with django_capture_on_commit_callbacks(execute=True):  # the exposures are remediated on commit
        assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    landed = WorkloadMove.objects.filter(sweep__campaign=campaign).select_related("target_node")
    assert {m.target_node.name for m in landed if m.target_node} == {"gpu06"} and landed.count() == 7
    assert set(Exposure.objects.filter(advisory=advisory, state="open").values_list("node__name", flat=True)) \
        == spares
    second = services.create_campaign(operator, {
        "name": "Patch 5703 spares", "pools": ["spare"], "parallelism_per_cluster": "2", "error_budget": "1",
        "workload_policy": "checkpoint", "canary": "0", "soak_s": 0, "approvals_required": 1}, [advisory.pk])
    plan = services.make_plan(second.pk, operator).content
    moves = [m for node in plan["nodes"].values() for m in node["moves"]]
    assert len(moves) == 2 and {m["action"] for m in moves} == {"migrate"}
    batch = {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "gpu08", "gpu09"}
    assert {m["to_name"] for m in moves} <= batch, moves
