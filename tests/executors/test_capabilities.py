"""Which optional capabilities (executors.base.Supports*) each back end has: the ones the engine and the
planner use where a back end has them, and do without where it has not."""

from __future__ import annotations

import pytest

from executors.base import (
    Executor,
    SupportsGpuUsers,
    SupportsHealthGates,
    SupportsMaintenanceHolds,
    SupportsRollback,
    SupportsSchedulerRelease,
    SupportsWaveReservations,
    executor_class,
)

CAPABILITIES = (SupportsGpuUsers, SupportsHealthGates, SupportsMaintenanceHolds, SupportsRollback,
                SupportsWaveReservations, SupportsSchedulerRelease)
CORE = ("reachable", "facts", "list_workloads", "drain", "checkpoint", "stop", "restore", "patch", "reboot",
        "verify", "return_to_service", "undo")


@pytest.mark.parametrize(("name", "reserves"), [("memory", False), ("local", False), ("slurm", True),
                                                ("kubernetes", False)])
def test_every_back_end_implements_the_core_and_the_capabilities_it_says(name: str, reserves: bool) -> None:
    cls = executor_class(name)
    assert all(getattr(cls, op) is not getattr(Executor, op) for op in CORE), "the whole core"
    has = {capability.__name__ for capability in CAPABILITIES if issubclass(cls, capability)}
    expected = {"SupportsGpuUsers", "SupportsHealthGates", "SupportsMaintenanceHolds", "SupportsRollback"}
    # Slurm alone reserves waves and hands held jobs back to its scheduler.
    assert has == (expected | {"SupportsWaveReservations", "SupportsSchedulerRelease"} if reserves else expected)


def test_the_core_alone_has_no_capability() -> None:
    assert not any(issubclass(Executor, capability) for capability in CAPABILITIES)
