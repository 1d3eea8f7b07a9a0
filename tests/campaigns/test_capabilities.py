"""A back end with the executor core only (executors.base.Executor, none of the Supports* capabilities)
still sweeps: the engine and the planner test for each capability and do without it."""

from __future__ import annotations

from typing import Any

import pytest

from campaigns import services
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.engine import runner
from campaigns.models import EvidenceEvent, NodeSweep
from executors import base as executors_base
from executors.base import (
    Executor,
    NodeRef,
    SupportsGpuUsers,
    SupportsHealthGates,
    SupportsMaintenanceHolds,
    SupportsRollback,
    SupportsWaveReservations,
)
from executors.memory import MemoryExecutor
from inventory.models import Cluster
from tests.campaigns.fleet import FIXED, approved_campaign, drive, make_fleet, user

pytestmark = pytest.mark.django_db
CAPABILITIES = (SupportsGpuUsers, SupportsHealthGates, SupportsMaintenanceHolds, SupportsRollback,
                SupportsWaveReservations)


class CoreOnlyExecutor(Executor):
    """The memory back end's core operations, and nothing else."""

    name = "core"

    def __init__(self, cluster: Cluster | None = None, **options: Any) -> None:
        super().__init__(cluster, **options)
        self.memory = MemoryExecutor(cluster, **options)

    def reachable(self, node: NodeRef) -> str:
        return self.memory.reachable(node)

    def facts(self, node: NodeRef) -> dict[str, str]:
        return self.memory.facts(node)

    def list_workloads(self, node: NodeRef) -> Any:
        return self.memory.list_workloads(node)

    def drain(self, node: NodeRef, operation_id: str) -> None:
        self.memory.drain(node, operation_id)

    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str,
                   requires: dict[str, Any] | None = None) -> Any:
        return self.memory.checkpoint(node, workload_id, engine, operation_id, requires=requires)

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> None:
        self.memory.stop(node, workload_id, operation_id)

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> Any:
        return self.memory.restore(target, checkpoint_id, operation_id)

    def patch(self, node: NodeRef, component: str, version: str, operation_id: str) -> Any:
        return self.memory.patch(node, component, version, operation_id)

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        self.memory.reboot(node, operation_id)

    def verify(self, node: NodeRef) -> Any:
        return self.memory.verify(node)

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        self.memory.return_to_service(node, operation_id)

    def undo(self, node: NodeRef, operation_id: str) -> None:
        self.memory.undo(node, operation_id)


@pytest.fixture
def people():
    return user("rita", "operator"), user("alan", "approver")


@pytest.fixture(autouse=True)
def core_only_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered as a site registers its own back end: a cluster may name only registered executors."""
    monkeypatch.setitem(executors_base.ALIASES, "core-only", f"{CoreOnlyExecutor.__module__}.CoreOnlyExecutor")


def core_only_fleet(nodes: int = 2) -> Any:
    fleet, cluster = make_fleet(nodes=nodes, spares=2)
    Cluster.objects.filter(pk=cluster.pk).update(connection={"executor": "core-only"})
    return fleet


def test_it_has_no_capability_and_the_memory_back_end_has_them_all_but_reservations() -> None:
    assert not any(isinstance(CoreOnlyExecutor(), capability) for capability in CAPABILITIES)
    memory = MemoryExecutor()
    assert [isinstance(memory, capability) for capability in CAPABILITIES] == [True, True, True, True, False]


def test_the_executor_a_step_uses_with_a_connection_pool_has_the_capabilities_of_its_back_end() -> None:
    # executor_for wraps the back end when the database has a connection pool (runner._Unpinned).
    memory, core = (runner._unpinned_class(type(ex))(ex) for ex in (MemoryExecutor(), CoreOnlyExecutor()))
    assert [isinstance(memory, capability) for capability in CAPABILITIES] == [True, True, True, True, False]
    assert not any(isinstance(core, capability) for capability in CAPABILITIES)
    assert memory.name == "memory" and core.reachable(NodeRef("c", "nowhere")) != ""


def test_a_sweep_without_health_gates_checks_the_versions_and_a_held_node_is_not_seen(people):
    fleet = core_only_fleet()
    fleet.hold("local/gpu01", "admin", "RMA 4711")  # the back end cannot report it
    requester, approver = people
    campaign = approved_campaign(requester, approver)
    assert campaign.approved_plan.content["held"] == []
    services.start(campaign.pk, requester)
    assert drive(campaign.pk).status == CampaignStatus.COMPLETED
    assert fleet.snapshot()["nodes"]["local/gpu00"]["versions"]["driver"] == FIXED
    assert set(NodeSweep.objects.filter(campaign=campaign).values_list("state", flat=True)) == {SweepState.DONE}
    checked = EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.HEALTH_CHECKED)
    assert checked.count() == 2
    assert all([c["name"] for c in e.data["checks"]] == ["versions"] and e.data["passed"] for e in checked)
    assert not EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.RESERVATION_CREATED).exists()


def test_a_failed_patch_without_rollback_is_a_failed_revert_and_the_node_stays_out(people):
    fleet = core_only_fleet(nodes=1)
    fleet.inject("patch", "local/gpu00", "permanent")
    requester, approver = people
    campaign = approved_campaign(requester, approver, error_budget="1")
    services.start(campaign.pk, requester)
    drive(campaign.pk)
    sweep = NodeSweep.objects.get(campaign=campaign)
    assert sweep.state == SweepState.FAILED
    failed = EvidenceEvent.objects.get(sweep=sweep, kind=EvidenceKind.REVERT_FAILED)
    assert failed.data["error"] == "the core back end cannot roll back local/gpu00"
    end = EvidenceEvent.objects.get(sweep=sweep, kind=EvidenceKind.FAILED)
    assert end.data["left"] == "out of service: the revert failed"
