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
- `reachable` says why an unknown node cannot be driven.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from executors.base import Executor, NodeRef, PermanentExecutorError


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
        ex.drain(harness.b, "contract-drain")
        assert not harness.takes_work(harness.b)
        ex.drain(harness.b, "contract-drain")  # the same id again: still drained, nothing new
        ex.undo(harness.b, "contract-undo")
        assert harness.takes_work(harness.b)

    def test_a_workload_moves_and_continues_where_it_stopped(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.a, "contract-move-drain")
        checkpoint = ex.checkpoint(harness.a, harness.workload, harness.engine, "contract-move-ck")
        assert checkpoint.checkpoint_id and checkpoint.sha256
        assert harness.workload not in harness.running(harness.a), "a checkpoint stops the workload"
        at_checkpoint = harness.progress(harness.workload)
        restored = ex.restore(harness.b, checkpoint.checkpoint_id, "contract-move-restore")
        assert self._wait(lambda: bool(harness.running(harness.b))), "the workload runs on the target"
        if at_checkpoint is not None:
            assert self._wait(lambda: (harness.progress(harness.workload) or 0) > at_checkpoint)
        # The same calls again, as a worker retrying after a crash: the first results, no copy.
        again = ex.checkpoint(harness.a, harness.workload, harness.engine, "contract-move-ck")
        assert again.checkpoint_id == checkpoint.checkpoint_id
        twice = ex.restore(harness.b, checkpoint.checkpoint_id, "contract-move-restore")
        assert twice.workload_id == restored.workload_id
        assert len(harness.running(harness.b)) == 1
        ex.undo(harness.a, "contract-move-undo")

    def test_a_second_restore_of_one_checkpoint_or_an_unknown_one_is_refused(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.a, "contract-once-drain")
        checkpoint = ex.checkpoint(harness.a, harness.workload, harness.engine, "contract-once-ck")
        ex.restore(harness.b, checkpoint.checkpoint_id, "contract-once-restore")
        with pytest.raises(PermanentExecutorError):
            ex.restore(harness.b, checkpoint.checkpoint_id, "contract-once-again")
        with pytest.raises(PermanentExecutorError):
            ex.restore(harness.b, "ck-does-not-exist", "contract-once-unknown")
        assert len(harness.running(harness.b)) == 1, "never two live copies of one workload"
        ex.undo(harness.a, "contract-once-undo")

    def test_patch_reboot_and_verify_reach_the_target_and_the_node_returns(self, harness: Harness) -> None:
        ex = harness.executor
        ex.drain(harness.b, "contract-patch-drain")
        first = ex.patch(harness.b, harness.component, harness.version, "contract-patch")
        assert first.after == harness.version
        assert ex.patch(harness.b, harness.component, harness.version, "contract-patch") == first
        ex.reboot(harness.b, "contract-reboot")
        ex.reboot(harness.b, "contract-reboot")
        result = ex.verify(harness.b)
        assert result.healthy and result.versions.get(harness.component) == harness.version
        ex.return_to_service(harness.b, "contract-return")
        assert harness.takes_work(harness.b)

    def test_an_unknown_node_is_not_reachable(self, harness: Harness) -> None:
        assert harness.executor.reachable(harness.a) == ""
        assert harness.executor.reachable(harness.unknown) != ""
