"""What the campaign pages show: the actions a state allows, progress, plan against actual, ETA.

Read only. The valid actions per status mirror the rules the service functions enforce (a button
shown is one the service accepts); the services stay the authority, the page only hides what
would be refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, Plan
from gpusweep.roles import Role, has_role

# Which role each action needs (the UI's and the API's rule).
ACTION_ROLES: dict[str, Role] = {
    "plan": Role.OPERATOR,
    "approve": Role.APPROVER,
    "start": Role.OPERATOR,
    "pause": Role.OPERATOR,
    "resume": Role.OPERATOR,
    "abort": Role.OPERATOR,
    "add_last_group": Role.OPERATOR,
    "rollback_completed": Role.OPERATOR,
}

# Which actions each status allows (campaigns.services refuses the others).
STATE_ACTIONS: dict[str, tuple[str, ...]] = {
    CampaignStatus.DRAFT: ("plan", "abort"),
    CampaignStatus.PLANNED: ("approve", "plan", "add_last_group", "abort"),
    CampaignStatus.APPROVED: ("start", "approve", "plan", "add_last_group", "abort"),
    CampaignStatus.RUNNING: ("pause", "abort"),
    CampaignStatus.WAITING: ("pause", "abort"),
    CampaignStatus.PAUSED: ("resume", "abort"),
    CampaignStatus.HALTED: ("resume", "abort", "rollback_completed"),
    CampaignStatus.COMPLETED: (),
    CampaignStatus.ABORTED: ("rollback_completed",),
}

ACTION_LABELS = {
    "plan": "Make a new plan", "approve": "Approve", "start": "Start", "pause": "Pause", "resume": "Resume",
    "abort": "Abort", "add_last_group": "Add exposed receivers as a last group",
    "rollback_completed": "Roll back completed nodes",
}


def valid_actions(campaign: Campaign, plan: Plan | None, user: AbstractBaseUser | AnonymousUser,
                  authors: set[int]) -> list[str]:
    """The actions this user may take on this campaign now, in the order the page shows them."""
    found = []
    for action in STATE_ACTIONS.get(campaign.status, ()):
        if not has_role(user, ACTION_ROLES[action]):
            continue
        approved_this = campaign.status == CampaignStatus.APPROVED and plan is not None and (
            campaign.approved_plan_id == plan.pk)
        if action == "approve" and (user.pk in authors or approved_this):
            continue  # authors never approve; an approved plan needs no more approvals
        if action == "add_last_group" and not (plan and plan.content.get("exposed_receivers")):
            continue
        if action == "rollback_completed" and not campaign.sweeps.filter(state=SweepState.DONE).exists():
            continue  # nothing was patched, so nothing to roll back
        found.append(action)
    return found


def event_label(event: EvidenceEvent) -> str:
    """'Draining done, next: Checkpointing' rather than 'step_done'."""
    data = event.data if isinstance(event.data, dict) else {}
    step = SweepState.label(data["step"]) if data.get("step") else ""
    if event.kind == EvidenceKind.STEP_DONE and step:
        following = SweepState.label(data["next"]) if data.get("next") else ""
        return f"{step} done" + (f", next: {following}" if following and data.get("next") != SweepState.DONE else "")
    if event.kind == EvidenceKind.STEP_FAILED and step:
        return f"{step} failed: {data.get('error', '')}"[:300]
    if event.kind == EvidenceKind.RETRY and step:
        return f"{step} to be retried (attempt {data.get('attempt', '?')}): {data.get('error', '')}"[:300]
    label = EvidenceKind.label(event.kind)
    if event.kind == EvidenceKind.ADMITTED and data.get("wave"):
        return f"{label} in wave {data['wave']}"
    if event.kind in (EvidenceKind.CHECKPOINTED, EvidenceKind.RESTORED, EvidenceKind.STOPPED,
                      EvidenceKind.PARKED, EvidenceKind.FINISHED, EvidenceKind.RETURNED):
        what = data.get("workload") or ""
        where = data.get("to") or data.get("returned_to") or ""
        return " ".join(p for p in (f"{label}:", str(what), f"on {where}" if where else "") if p)
    if event.kind == EvidenceKind.APPROVED and data.get("version"):
        return f"{label} plan v{data['version']}" + (f": {data['comment']}" if data.get("comment") else "")
    return label


@dataclass
class NodeRow:
    sweep: NodeSweep
    planned_start: datetime | None
    planned_end: datetime | None
    started: datetime | None = None
    finished: datetime | None = None

    @property
    def delay_s(self) -> float | None:
        """How much later than planned the node finished (or is, while still working)."""
        if self.planned_end is None:
            return None
        end = self.finished or (timezone.now() if self.started else None)
        if end is None or (self.finished is None and end < self.planned_end):
            return None
        return (end - self.planned_end).total_seconds()


@dataclass
class Board:
    status: str
    counts: dict[str, int]
    total: int
    done: int
    working: int
    failed: int
    rows: list[NodeRow] = field(default_factory=list)
    eta: datetime | None = None
    eta_basis: str = ""
    planned_end: datetime | None = None
    live: bool = False

    @property
    def percent(self) -> int:
        return round(100 * (self.done + self.failed) / self.total) if self.total else 0

    @property
    def percent_done(self) -> float:
        return 100 * self.done / self.total if self.total else 0

    @property
    def percent_working(self) -> float:
        return 100 * self.working / self.total if self.total else 0

    @property
    def percent_failed(self) -> float:
        return 100 * self.failed / self.total if self.total else 0


def _when(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) and value else None


FINAL_KINDS = (EvidenceKind.DONE, EvidenceKind.FAILED, EvidenceKind.ROLLED_BACK, EvidenceKind.SKIPPED)


def board(campaign: Campaign, plan: Plan | None) -> Board:
    """Progress of a campaign's sweeps, each node's plan against what happened, and the ETA."""
    sweeps = list(campaign.sweeps.select_related("node").prefetch_related("moves__target_node")
                  .order_by("wave", "position"))
    started: dict[int, datetime] = {}
    finished: dict[int, datetime] = {}
    for sweep_id, kind, at in EvidenceEvent.objects.filter(
            campaign=campaign, kind__in=(EvidenceKind.ADMITTED, *FINAL_KINDS)).values_list("sweep_id", "kind", "at"):
        if kind == EvidenceKind.ADMITTED:
            started.setdefault(sweep_id, at)
        else:
            finished[sweep_id] = at
    planned_nodes = (plan.content.get("nodes") or {}) if plan else {}
    rows = []
    for sweep in sweeps:
        planned = sweep.planned or planned_nodes.get(str(sweep.node_id), {})
        rows.append(NodeRow(sweep, _when(planned.get("expected_start")), _when(planned.get("expected_end")),
                            started.get(sweep.pk), finished.get(sweep.pk)))
    counts: dict[str, int] = {}
    for sweep in sweeps:
        counts[sweep.state] = counts.get(sweep.state, 0) + 1
    done = counts.get(SweepState.DONE, 0) + counts.get(SweepState.SKIPPED, 0)
    failed = counts.get(SweepState.FAILED, 0) + counts.get(SweepState.ROLLED_BACK, 0)
    working = sum(n for state, n in counts.items() if state in SweepState.WORKING)
    planned_total = len(planned_nodes) if not sweeps else 0  # sweeps are made at start
    result = Board(status=campaign.status, counts=counts, total=len(sweeps) or planned_total, done=done,
                   working=working, failed=failed, rows=rows, live=campaign.status not in CampaignStatus.TERMINAL)
    summary = (plan.summary or plan.content.get("summary") or {}) if plan else {}
    result.planned_end = _when(summary.get("expected_end"))
    result.eta, result.eta_basis = _eta(campaign, rows, working, result.planned_end)
    return result


def _eta(campaign: Campaign, rows: list[NodeRow], working: int, planned_end: datetime | None
         ) -> tuple[datetime | None, str]:
    """When the campaign should finish: from the pace so far once a node is done, else the plan."""
    if campaign.status in CampaignStatus.TERMINAL:
        return campaign.finished_at, "finished"
    remaining = [r for r in rows if r.sweep.state not in SweepState.TERMINAL]
    durations = [(r.finished - r.started).total_seconds() for r in rows if r.finished and r.started]
    if campaign.status not in CampaignStatus.ACTIVE or not durations:
        return planned_end, "plan"
    per_node = sum(durations) / len(durations)
    limits = campaign.limits.get("cluster") if isinstance(campaign.limits, dict) else None
    parallel = max(1, working, sum(limits.values()) if isinstance(limits, dict) and limits else 1)
    return timezone.now() + timedelta(seconds=math.ceil(len(remaining) / parallel) * per_node), "pace"


def windows_text(windows: list[dict[str, Any]]) -> list[str]:
    """[{"days": [0..4], "start": "22:00", "end": "06:00", "tz": "UTC"}] as 'Mon-Fri 22:00-06:00 UTC'."""
    names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    texts = []
    for window in windows or []:
        days = sorted(int(d) for d in window.get("days", range(7)))
        if days == list(range(7)):
            day_text = "every day"
        elif days and days == list(range(days[0], days[-1] + 1)) and len(days) > 2:
            day_text = f"{names[days[0]]}-{names[days[-1]]}"
        else:
            day_text = ", ".join(names[d] for d in days)
        texts.append(f"{day_text} {window.get('start', '00:00')}-{window.get('end', '24:00')} "
                     f"{window.get('tz', 'UTC')}")
    return texts


def plan_view(content: dict[str, Any], deadline: datetime | None, advisories: list[Any]) -> dict[str, Any]:
    """A stored plan as the page shows it: waves in time order with the deadline placed among them,
    each node with its target and where each workload goes, and every warning in words."""
    nodes = content.get("nodes") or {}
    waves: list[dict[str, Any]] = []
    deadline_placed = deadline is None
    for wave in content.get("waves") or []:
        start, end = _when(wave.get("start")), _when(wave.get("end"))
        if not deadline_placed and deadline is not None and start is not None and start > deadline:
            waves.append({"deadline": deadline})
            deadline_placed = True
        members = [nodes[str(n)] for n in wave.get("nodes", []) if str(n) in nodes]
        waves.append({"wave": wave.get("wave"), "start": start, "end": end, "canary": wave.get("canary"),
                      "nodes": members, "late": bool(deadline and end and end > deadline),
                      "reservations": wave.get("reservations") or []})
    if not deadline_placed:
        waves.append({"deadline": deadline})
    warnings: list[str] = []
    for item in content.get("cold_starts") or []:
        warnings.append(f"Cold start: {item.get('name') or item.get('workload')} on {item.get('node_name')}"
                        f" ({item.get('why', '')})")
    for item in content.get("finish_first") or []:
        warnings.append(f"Finish first: {item.get('name') or item.get('workload')} on {item.get('node_name')}"
                        " must end before its node drains")
    for item in content.get("no_capacity") or []:
        warnings.append(f"No capacity: {item.get('name') or item.get('workload')} on {item.get('node_name')}"
                        f" ({item.get('why', '')})")
    for item in content.get("exposed_receivers") or []:
        warnings.append(f"Exposed receiver: {item.get('cluster')}/{item.get('name')} is itself exposed to "
                        f"{', '.join(item.get('advisories') or [])} and receives "
                        f"{', '.join(item.get('workloads') or [])}")
    for item in content.get("blocked") or []:
        warnings.append(f"Blocked, not swept: {item.get('cluster')}/{item.get('name')}: {item.get('reason')}")
    for item in content.get("held") or []:
        warnings.append(f"Held by someone else, not swept: {item.get('cluster')}/{item.get('name')}: "
                        f"{item.get('hold')}")
    for entry in content.get("unreported_gpu_users") or []:
        for user in entry.get("users") or []:
            if user.get("error"):
                warnings.append(f"GPU users of {entry.get('name')} unknown: {user['error']}")
                continue
            owner = user.get("owner") or {}
            warnings.append(f"GPU users the scheduler did not report: {entry.get('name')}, pid {user.get('pid')} "
                            f"{user.get('name', '')} ({owner.get('kind', 'process')}"
                            f"{' ' + str(owner['id']) if owner.get('id') else ''}): {user.get('action', '')}")
    for node in nodes.values():
        for risk in node.get("risks") or []:
            if risk.startswith("past deadline") or risk.startswith("no window"):
                text = risk.replace("past deadline", "ends after the deadline")
                warnings.append(f"{node.get('cluster')}/{node.get('name')}: {text}")
    for advisory in advisories:
        if getattr(advisory, "integrity", "") == "mismatch":
            warnings.append(f"Integrity mismatch: {advisory.publisher} {advisory.publisher_id}'s document does not "
                            f"match its published SHA-256 (expected {advisory.published_sha256 or '?'}, got "
                            f"{advisory.content_sha256 or '?'}); check the bulletin before trusting its ranges")
    return {"waves": waves, "warnings": warnings, "summary": content.get("summary") or {},
            "skipped": content.get("skipped") or [], "deadline": deadline}
