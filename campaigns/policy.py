"""A campaign's rules, in one place for the API, the UI, the services, the engine and the planner.

- The error budget: how many failed nodes a campaign tolerates; one more halts it.
- The workload policy: what happens to a workload on a node being drained.
- The step deadline: when a step that has not finished is re-driven.
- The wait: how often the engine looks again at a workload it waits for.
- Reservations: how long a wave's maintenance reservation lasts.
- Admission: which pending node may start now, and which nodes hold the wave order (the engine
  runs it; the simulator of costs/ replays it, so what it predicts is what a campaign does).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from campaigns.planner import PlanError, parse_limit
from inventory.choices import WorkloadPolicy

if TYPE_CHECKING:
    from campaigns.models import Campaign

# Seconds between two looks at a workload the engine waits for (policy "wait"): the engine sees it
# end at the first look after its end, and the simulator (costs/strategies.py) counts the same.
WAIT_POLL_S = 30.0


def allowed_failures(error_budget: str, total: int) -> int:
    """Failed nodes tolerated out of `total`: '2' or '10%' (rounded down); '0' halts at the first."""
    text = (error_budget or "").strip()
    if text in ("0", "0%"):
        return 0
    return parse_limit(text, total, "error_budget")


def check_error_budget(error_budget: str) -> None:
    """Raise PlanError (naming the field) for a budget that is not '0', a count or a percentage."""
    allowed_failures(error_budget, 100)


def workload_policy(campaign: Campaign, ref: str, name: str, own_policy: str) -> str:
    """A per-workload override first, then the workload's own non-default policy, then the campaign's."""
    overrides = campaign.workload_overrides or {}
    if ref in overrides:
        return str(overrides[ref])
    if name and name in overrides:
        return str(overrides[name])
    # A workload's own non-default policy (set by its owner) beats the campaign default.
    if own_policy and own_policy != WorkloadPolicy.CHECKPOINT:
        return own_policy
    return campaign.workload_policy


def check_overrides(overrides: object) -> None:
    if not isinstance(overrides, dict):
        raise PlanError('workload_overrides must be an object: {"workload id or name": "policy"}')
    bad = {k: v for k, v in overrides.items() if v not in WorkloadPolicy.values()}
    if bad:
        raise PlanError(f"workload_overrides: unknown policies {bad}; use {WorkloadPolicy.values()}")


def step_deadline(step_timeout_s: int, now: datetime) -> datetime:
    """A step still running after this is taken to be lost (its worker died) and re-driven."""
    return now + timedelta(seconds=step_timeout_s)


# A wave's maintenance reservation lasts its planned time plus this margin (a late step, a slow reboot).
RESERVATION_MARGIN = timedelta(minutes=30)


def reservation_minutes(start: datetime | None, end: datetime | None, now: datetime) -> int:
    """How long a wave's reservation made at `now` lasts: to the plan's end of the wave (or for the wave's
    planned duration, when it starts late), plus the margin; the margin alone without a planned time."""
    left = timedelta(0)
    if end is not None:
        left = max(end - now, end - start if start is not None else timedelta(0), timedelta(0))
    return int((left + RESERVATION_MARGIN).total_seconds() + 59) // 60


def admits(wave: int, lowest: int, in_cluster: int, cluster_limit: int, in_pool: int = 0,
           pool_limit: int | None = None) -> bool:
    """May a pending node of `wave` start, with `lowest` the lowest wave that holds the order?

    Waves go in order: wave v starts only when every wave up to v-2 is finished, so the nodes
    receiving its workloads (wave v+2 or later, or patched ones of v-2 and before) are not being
    drained meanwhile; and the nodes in flight stay within the limits the approver read.

    A node waiting for a receiver (NodeSweep.waiting_since set) counts in `in_cluster` and `in_pool`
    (it keeps its slot) but not in `lowest`: its receivers are looked for again at every look
    (engine.steps._nowhere_to_go, engine.targets.choose_target, which never picks a node being
    swept), so later waves may start while it waits; it holds the order again once it goes on.
    """
    if wave > lowest + 1 or in_cluster >= cluster_limit:
        return False
    return pool_limit is None or in_pool < pool_limit
