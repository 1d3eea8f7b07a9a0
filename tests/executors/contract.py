"""The contract every executor passes (executors/base.py), written once.

A back end's test module subclasses `ExecutorContract` and provides a `harness` fixture giving a
`Harness`: the executor, two compatible nodes (`a` with a running checkpointable workload, `b`
free), an unknown node, and how to look at the back end's own state (is the node taking work?
which workloads run where?). The tests here then check, through the executor alone:

- drain stops the node taking work and undo gives it back; return to service does too;
- checkpoint saves and stops a workload, restore resumes it on the other node, from where it was;
- patch, reboot and verify take a node to the target version;
- every mutating call is idempotent under its operation id: repeating it (a worker that died
  after the call and retried it) returns the first result and does nothing twice, so a retry
  finds what the first attempt did;
- a restore that cannot succeed (an unknown checkpoint, one restored already) is a permanent
  error, never a second copy;
- `reachable` says why an unknown node cannot be driven;
- a node someone else took out of service is reported by `maintenance_hold`, and gpusweep's own
  drain and undo (or return to service) leave that hold as it was: only its own marks go;
- after the reboot the health gates pass on a healthy node, and fail, with the failing check's
  output, on a wrong version or a check the node fails (`fail_check`); a rollback after the patch
  brings the versions from before it back at the next reboot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from executors.base import Executor, HealthGates, NodeRef, PermanentExecutorError


def op(step: str) -> str:
    """An operation id as the engine makes them: campaign, sweep, step (a back end may read its
    campaign and sweep from it, e.g. to name its marks and to lift only its own)."""
    return f"gs-900-1-{step}"


@dataclass
class Harness:
    executor: Executor
    a: NodeRef
    b: NodeRef
    workload: str  # running on `a`, checkpointable with `engine`
    engine: str
    component: str  # what `patch` changes, and to which version
    version: str
    unknown: NodeRef
    # The back end's own view: does the node take new work? which workloads run on it?
    takes_work: Callable[[NodeRef], bool]
    running: Callable[[NodeRef], set[str]]
    # A workload's progress as its own counter reports it (None where the back end cannot tell).
    progress: Callable[[str], int | None] = field(default=lambda _workload: None)
    # Someone other than gpusweep takes the node out of service, with a reason (a repair, an admin).
    hold: Callable[[NodeRef, str], None] | None = None
    # One of the node's health checks fails from now on, printing this output.
    fail_check: Callable[[NodeRef, str], None] | None = None


class ExecutorContract:
    """Mixin: subclasses provide the `harness` fixture."""

    @staticmethod
    def _wait(predicate: Callable[[], bool], timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        return predicate()

    def test_drain_stops_new_work_and_undo_gives_the_node_back(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.b, op("drain"))
        assert not harness.takes_work(harness.b)
        ex.drain(harness.b, op("drain"))  # the same id again: still drained, nothing new
        ex.undo(harness.b, op("undo"))
        assert harness.takes_work(harness.b)

    def test_a_workload_moves_and_continues_where_it_stopped(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.a, op("move-drain"))
        checkpoint = ex.checkpoint(harness.a, harness.workload, harness.engine, op("move-ck"))
        assert checkpoint.checkpoint_id and checkpoint.sha256
        assert harness.workload not in harness.running(harness.a), "a checkpoint stops the workload"
        at_checkpoint = harness.progress(harness.workload)
        restored = ex.restore(harness.b, checkpoint.checkpoint_id, op("move-restore"))
        assert self._wait(lambda: bool(harness.running(harness.b))), "the workload runs on the target"
        if at_checkpoint is not None:
            assert self._wait(lambda: (harness.progress(harness.workload) or 0) > at_checkpoint)
        # The same calls again, as a worker retrying after a crash: the first results, no copy.
        again = ex.checkpoint(harness.a, harness.workload, harness.engine, op("move-ck"))
        assert again.checkpoint_id == checkpoint.checkpoint_id
        twice = ex.restore(harness.b, checkpoint.checkpoint_id, op("move-restore"))
        assert twice.workload_id == restored.workload_id
        assert len(harness.running(harness.b)) == 1
        ex.undo(harness.a, op("move-undo"))

    def test_a_second_restore_of_one_checkpoint_or_an_unknown_one_is_refused(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.a, op("once-drain"))
        checkpoint = ex.checkpoint(harness.a, harness.workload, harness.engine, op("once-ck"))
        ex.restore(harness.b, checkpoint.checkpoint_id, op("once-restore"))
        with pytest.raises(PermanentExecutorError):
            ex.restore(harness.b, checkpoint.checkpoint_id, op("once-again"))
        with pytest.raises(PermanentExecutorError):
            ex.restore(harness.b, "ck-does-not-exist", op("once-unknown"))
        assert len(harness.running(harness.b)) == 1, "never two live copies of one workload"
        ex.undo(harness.a, op("once-undo"))

    def test_patch_reboot_and_verify_reach_the_target_and_the_node_returns(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.b, op("patch-drain"))
        first = ex.patch(harness.b, harness.component, harness.version, op("patch"))
        assert first.after == harness.version
        assert ex.patch(harness.b, harness.component, harness.version, op("patch")) == first
        ex.reboot(harness.b, op("reboot"))
        ex.reboot(harness.b, op("reboot"))
        result = ex.verify(harness.b)
        assert result.healthy and result.versions.get(harness.component) == harness.version
        ex.return_to_service(harness.b, op("return"))
        assert harness.takes_work(harness.b)

    def test_an_unknown_node_is_not_reachable(self, harness: Harness) -> None:
        assert harness.executor.reachable(harness.a) == ""
        assert harness.executor.reachable(harness.unknown) != ""

    def test_someone_elses_hold_is_reported_and_outlives_gpusweeps_drain_and_undo(self, harness: Harness) -> None:
        assert harness.hold is not None, "the harness must say how someone else takes a node out of service"
        ex = harness.executor
        assert ex.maintenance_hold(harness.b) == ""
        harness.hold(harness.b, "RMA 4711: a GPU throws Xid 79")
        held = ex.maintenance_hold(harness.b)
        assert held, "a node out of service for someone else is reported"
        ex.drain(harness.b, op("held-drain"))
        ex.undo(harness.b, op("held-undo"))
        assert not harness.takes_work(harness.b), "gpusweep's undo must not lift someone else's hold"
        assert ex.maintenance_hold(harness.b) == held
        ex.drain(harness.b, op("held-drain-2"))
        ex.return_to_service(harness.b, op("held-return"))
        assert not harness.takes_work(harness.b) and ex.maintenance_hold(harness.b) == held

    def test_health_gates_pass_and_a_failing_check_fails_them_with_its_output(self, harness: Harness) -> None:
        assert harness.fail_check is not None, "the harness must say how one of a node's checks fails"
        ex, node, want = harness.executor, harness.b, {harness.component: harness.version}
        ex.drain(node, op("gate-drain"))
        ex.patch(node, harness.component, harness.version, op("gate-patch"))
        ex.reboot(node, op("gate-reboot"))
        first = ex.health(node, want, HealthGates(), op("gate-1"))
        assert first.passed, first.as_dict()
        assert "versions" in [c.name for c in first.checks]
        wrong = ex.health(node, {harness.component: "1.2.3"}, HealthGates(), op("gate-2"))
        assert not wrong.passed and "versions" in wrong.failed
        harness.fail_check(node, "GPU 2: 17 uncorrectable ECC errors")
        failed = ex.health(node, want, HealthGates(), op("gate-3"))
        assert not failed.passed
        assert any("17 uncorrectable ECC errors" in c.output for c in failed.checks if c.status == "failed")
        # The same operation id again: the first answer (a retried step finds what it found).
        assert ex.health(node, want, HealthGates(), op("gate-1")).passed
        ex.undo(node, op("gate-undo"))

    def test_a_rollback_after_the_patch_brings_back_the_versions_from_before_it(self, harness: Harness) -> None:
        ex, node = harness.executor, harness.b
        before = ex.facts(node).get(harness.component)
        assert before and before != harness.version
        ex.drain(node, op("rb-drain"))
        ex.patch(node, harness.component, harness.version, op("rb-patch"))
        ex.reboot(node, op("rb-reboot"))
        assert ex.facts(node).get(harness.component) == harness.version
        result = ex.rollback(node, op("rb-rollback"))
        assert result.components.get(harness.component) == before
        assert ex.rollback(node, op("rb-rollback")) == result
        ex.reboot(node, op("rb-reboot-back"))
        assert ex.facts(node).get(harness.component) == before
        ex.undo(node, op("rb-undo"))
