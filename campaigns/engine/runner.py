"""Running a node's sweep: ``advance`` claims the current step's lease, runs its steps one after
another while they succeed, and ends each one through ``end_step`` (campaigns.engine.ending).

Read top-down: advance -> lease.claim -> _step -> steps.STEPS[state] (or recovery for an abort or a
failure) -> ending.end_step. A worker goes straight on with the node's next step under the same lease,
so a node costs one task, not one per step; a worker that ends a sweep admits the next nodes itself.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable
from typing import Any, cast

from django.db import DatabaseError, IntegrityError, connection

from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.engine import lease, recovery, rows
from campaigns.engine.admission import dispatch
from campaigns.engine.ending import NextStep, RunAgain, end_step, may_retry, retry
from campaigns.engine.naming import node_ref
from campaigns.engine.steps import STEPS, NotPatched, WaitMore
from campaigns.models import NodeSweep
from campaigns.queue import enqueue_now
from executors.base import Executor, ExecutorError, PermanentExecutorError, TemporaryExecutorError, get_executor

log = logging.getLogger("campaigns.engine")


def advance(sweep_id: int, worker: str | None = None, max_steps: int | None = None) -> str | None:
    """Run the sweep's steps from the current one while they succeed (at most `max_steps`, and then
    the lease is given back); return the state it rests in."""
    worker = worker or uuid.uuid4().hex[:16]
    sweep = rows.load_sweep(sweep_id)
    if sweep is None or sweep.state not in SweepState.WORKING or not lease.claim(sweep, worker):
        return None
    state: str | None = sweep.state
    taken = 0
    while True:
        state, go_on = _step(sweep, worker)
        taken += 1
        if go_on and max_steps is not None and taken >= max_steps:
            # Stop here, leaving the next step for whoever advances it (tests step one at a time).
            lease.let_go(sweep_id, worker)
            return state
        if not go_on:
            if state in SweepState.TERMINAL:
                _dispatch_after(sweep.campaign_id)
            return state
        # The sweep in hand is current (this worker wrote it); only an abort can have come meanwhile,
        # and it matters only before the patch: the transition read the campaign's status then (and
        # the move into patching checks it in its UPDATE).


def _step(sweep: NodeSweep, worker: str) -> tuple[str | None, bool]:
    """One step under the lease, ended by end_step; (state now, whether this worker goes on with the
    next one)."""
    ex = executor_for(sweep)
    try:
        if recovery.failure_recorded(sweep):
            return end_step(sweep, worker, recovery.resume_failure(sweep, worker, ex)), False
        if sweep.state in SweepState.BEFORE_PATCH and sweep.campaign.status == CampaignStatus.ABORTED:
            return end_step(sweep, worker, recovery.unwind(sweep, worker, ex, SweepState.ROLLED_BACK, "")), False
        try:
            result = STEPS[sweep.state](sweep, ex, node_ref(sweep.node))
        except (ExecutorError, WaitMore, DatabaseError):
            raise
        except Exception as exc:  # any other failure of a step is the back end's: recorded, retried
            raise unexpected(exc) from exc
    except WaitMore as wait:
        data = {"reason": str(wait), **wait.detail, **({"for_receiver": True} if wait.for_receiver else {})}
        waiting = RunAgain(wait.seconds, EvidenceKind.WAITING, data, for_receiver=wait.for_receiver)
        return end_step(sweep, worker, waiting), False
    except TemporaryExecutorError as exc:
        if may_retry(sweep):
            return end_step(sweep, worker, retry(sweep, str(exc))), False
        given_up = recovery.on_failure(sweep, worker, ex, f"gave up after {sweep.attempt} attempts: {exc}")
        return end_step(sweep, worker, given_up), False
    except PermanentExecutorError as exc:
        failed = recovery.on_failure(sweep, worker, ex, str(exc), revert=not isinstance(exc, NotPatched),
                                     detail=getattr(exc, "detail", None))
        return end_step(sweep, worker, failed), False
    except IntegrityError:
        return None, False  # another worker wrote this node's chain: the lease was lost
    following = end_step(sweep, worker, NextStep(result))
    return following, following in SweepState.WORKING


def unexpected(exc: Exception) -> TemporaryExecutorError:
    """An exception that is no ExecutorError (a full disk's OSError, a bug in a back end) as a temporary
    executor error whose retry event carries its traceback: retried, then failing the node, never silent."""
    trace = "".join(traceback.format_exception(exc))[-3000:]
    return TemporaryExecutorError(f"{type(exc).__name__}: {exc}\n{trace}")


def _dispatch_after(campaign_id: int) -> None:
    """This worker ended a sweep, so its slot is free: admit the next nodes here and now rather than
    through a dispatch task (one task less per node). Should it fail, a task does it after all;
    should the worker die first, the periodic re-drive dispatches every running campaign."""
    try:
        dispatch(campaign_id)
    except DatabaseError:
        log.exception("campaign %s: dispatch after a finished node failed; enqueued instead", campaign_id)
        enqueue_now("dispatch", campaign_id)


def executor_for(sweep: NodeSweep) -> Executor:
    ex = get_executor(sweep.node.cluster)
    if (connection.settings_dict.get("OPTIONS") or {}).get("pool"):
        return cast(Executor, _unpinned_class(type(ex))(ex))
    return ex


class _Unpinned:
    """An executor whose every call first gives this thread's database connection back to the pool.

    A step waits on its node for seconds to minutes; k nodes in flight must not hold k database
    connections meanwhile (GPUSWEEP_DB_POOL_SIZE). Inside a transaction nothing is given back.
    """

    def __init__(self, executor: Executor) -> None:
        self._executor = executor

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._executor, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            if not connection.in_atomic_block:
                connection.close()
            return value(*args, **kwargs)

        return call


def _through(name: str) -> Callable[..., Any]:
    def method(self: _Unpinned, *args: Any, **kwargs: Any) -> Any:
        return self.__getattr__(name)(*args, **kwargs)

    return method


_UNPINNED: dict[type[Executor], type[_Unpinned]] = {}


def _unpinned_class(cls: type[Executor]) -> type[_Unpinned]:
    """_Unpinned with each public method of `cls` on the class itself, so that the wrapper implements
    exactly the capabilities (executors.base.Supports*) the executor does: a Protocol's isinstance
    looks at attributes, which __getattr__ alone does not show on every Python."""
    if cls not in _UNPINNED:
        methods = {name: _through(name) for name in dir(cls)
                   if not name.startswith("_") and callable(getattr(cls, name))}
        _UNPINNED[cls] = type(f"Unpinned{cls.__name__}", (_Unpinned,), methods)
    return _UNPINNED[cls]
