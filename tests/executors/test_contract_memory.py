"""The executor contract on the memory back end (the test double itself: no real part to drive)."""

from __future__ import annotations

import pytest

from executors.base import NodeRef
from executors.memory import Fleet, MemoryExecutor
from tests.executors.contract import ExecutorContract, Harness

OLD = {"driver": "570.86.15", "cuda": "12.8"}


class TestMemoryExecutor(ExecutorContract):
    @pytest.fixture
    def harness(self) -> Harness:
        fleet = Fleet()
        fleet.reset()
        for name in ("a", "b"):
            fleet.add_node("c", name, versions=OLD)
        fleet.add_workload("c", "a", "w1", name="trainer", rate=1000)

        def running(node: NodeRef) -> set[str]:
            return {w["name"] for w in fleet.snapshot()["nodes"][node.identity]["workloads"].values()
                    if w["state"] == "running"}

        def progress(name: str) -> int | None:
            found = [w for n in fleet.snapshot()["nodes"].values() for w in n["workloads"].values()
                     if w["name"] == name]
            return max((w["steps"] for w in found), default=None)

        return Harness(
            executor=MemoryExecutor(), a=NodeRef("c", "a"), b=NodeRef("c", "b"), workload="w1", engine="criu",
            component="driver", version="570.195.03", unknown=NodeRef("c", "nowhere"),
            takes_work=lambda node: not (fleet.snapshot()["nodes"][node.identity]["maintenance"]
                                         or fleet.snapshot()["nodes"][node.identity].get("holds")),
            running=running, progress=lambda _workload: progress("trainer"),
            hold=lambda node, reason: fleet.hold(node.identity, "admin", reason),
            fail_check=lambda node, output: fleet.fail_check(node.identity, "site:ecc", output),
        )
