"""The executor contract on the local back end: two real node agents (agent/), a real counter
process checkpointed by the signal engine, the agents' simulated patch and reboot."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from executors.base import NodeRef
from executors.local import LocalExecutor
from tests.executors.contract import ExecutorContract, Harness, op
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "agent" / "tests"))
import agent_helpers as agents


class TestLocalExecutor(ExecutorContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[Harness]:
        store = tmp_path / "artifacts"
        health_options, fail = agents.site_check(tmp_path)
        simulate = {"reboot_command": "simulate", "patch_methods": '{"package": {"simulate": true}}',
                    "health_options": health_options, **agents.NO_SCHEDULER}
        started = {name: agents.AgentProcess(tmp_path, name, store, **simulate).start() for name in ("a", "b")}
        log = tmp_path / "counter.log"
        proc = agents.start_workload(started["a"], "wl-1", log, megabytes=1, engine="signal")
        try:
            agents.wait_steps(log, 3)
            refs = {name: NodeRef(agents.CLUSTER, name, endpoint=f"http://127.0.0.1:{agent.port}")
                    for name, agent in started.items()}
            by_ref = {refs[name].identity: agent for name, agent in started.items()}

            def running(node: NodeRef) -> set[str]:
                listed = by_ref[node.identity].client.get("/v1/workloads")["workloads"]
                return {w["id"] for w in listed if w["state"] in ("running", "restored")}

            def takes_work(node: NodeRef) -> bool:
                return not by_ref[node.identity].client.get("/v1/health")["maintenance"]

            yield Harness(
                executor=LocalExecutor(secret=agents.FLEET_SECRET, operation_timeout=60), a=refs["a"], b=refs["b"],
                workload="wl-1", engine="signal", component="driver", version="570.195.03",
                unknown=NodeRef(agents.CLUSTER, "nowhere"), takes_work=takes_work, running=running,
                progress=lambda _workload: len(agents.steps(log)) if log.exists() else None,
                # An operator's own hold, through the agent's API with the node's key.
                hold=lambda node, reason: by_ref[node.identity].client.call(
                    "/v1/maintenance", "operator-hold", enabled=True, owner="operator", reason=reason),
                # The agents' real site check script fails on this node from now on.
                fail_check=lambda node, output: fail(node.name, output),
            )
        finally:
            for agent in started.values():
                agent.stop()
            proc.kill()  # the restored copy (named after tmp_path) goes with the suite's process sweep

    def test_the_counters_own_step_is_its_progress_at_the_checkpoint_and_the_restore(self, harness: Harness) -> None:
        """The step the application acknowledged (``{"step": N}``) is the move's steps before and after:
        what the campaign report prints (issue 31)."""
        ex = harness.executor
        ex.drain(harness.a, op("steps-drain"))
        checkpoint = ex.checkpoint(harness.a, harness.workload, harness.engine, op("steps-ck"))
        assert checkpoint.steps is not None and checkpoint.steps == harness.progress(harness.workload)
        restored = ex.restore(harness.b, checkpoint.checkpoint_id, op("steps-restore"))
        assert restored.steps == checkpoint.steps  # it resumes from the step it saved
        ex.undo(harness.a, op("steps-undo"))
