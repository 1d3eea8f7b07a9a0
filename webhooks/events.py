"""What gpusweep tells subscribers, built from the other apps' rows (read only) and emitted once each.

- campaign evidence (``campaigns.signals.evidence_recorded``): a campaign-level state change is
  ``campaign.state_changed``; a new plan is also ``campaign.approval_requested``; a node's ``failed``
  event is ``node.failed``. Keyed by the evidence hash, so a signal sent twice emits once.
- ``advisories.signals.advisories_matched``: a bulletin (per tracking version) with open or presumed
  exposures is ``advisory.ingested``, with its exposed node count per cluster.
- ``scan_deadlines`` (beat): per advisory and cluster, open exposures past their deadline
  (``exposure.overdue``) or within ``GPUSWEEP_WEBHOOK_DUE_SOON_DAYS`` of it (``exposure.due_soon``),
  each once per advisory, cluster and earliest deadline.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from advisories.choices import ExposureState
from advisories.models import Advisory, Exposure, public_id
from campaigns.choices import EvidenceKind
from campaigns.models import Campaign, EvidenceEvent, NodeSweep
from webhooks.choices import EventType
from webhooks.models import Subscription
from webhooks.services import emit
from webhooks.wire import absolute

# The campaign-level evidence kinds that are state changes, and the state each leads to.
STATE_AFTER = {
    EvidenceKind.CREATED: "draft", EvidenceKind.PLANNED: "planned", EvidenceKind.FULLY_APPROVED: "approved",
    EvidenceKind.STARTED: "running", EvidenceKind.WAITING_FOR_WINDOW: "waiting",
    EvidenceKind.WINDOW_OPENED: "running", EvidenceKind.PAUSED: "paused", EvidenceKind.RESUMED: "running",
    EvidenceKind.HALTED: "halted", EvidenceKind.ABORTED: "aborted", EvidenceKind.COMPLETED: "completed",
    EvidenceKind.EDITED: "draft",
}
NODE_FAILURES = frozenset({EvidenceKind.FAILED})
LIVE = [ExposureState.OPEN, ExposureState.PRESUMED]
SAMPLE = 20  # nodes named in an event; the count covers all


def _listened(*kinds: str) -> bool:
    return any(s.wants(kind) for s in Subscription.objects.filter(active=True) for kind in kinds)


def _campaign_facts(campaign: Campaign) -> dict[str, Any]:
    plan = campaign.approved_plan or campaign.plans.order_by("-version").first()
    summary = (plan.content.get("summary") or {}) if plan else {}
    waves = (plan.content.get("waves") or []) if plan else []
    return {"campaign": campaign.pk, "name": campaign.name,
            "advisories": sorted(a.public_id for a in campaign.advisories.only("publisher", "publisher_id")),
            "requested_by": str(campaign.requested_by or ""), "approvals_required": campaign.approvals_required,
            "plan_version": plan.version if plan else None, "nodes": summary.get("nodes"),
            "expected_start": waves[0]["start"] if waves else None,
            "expected_end": summary.get("expected_end"), "deadline": campaign.deadline,
            "started_at": campaign.started_at, "finished_at": campaign.finished_at,
            "url": absolute(f"/campaigns/{campaign.pk}/")}


def on_evidence(campaign_id: int, sweep_id: int | None, kind: str, seq: int, hash: str, actor: str, at: datetime,
                data: dict[str, Any]) -> None:
    if sweep_id is None and kind in STATE_AFTER:
        if not _listened(EventType.CAMPAIGN_STATE, EventType.APPROVAL_REQUESTED):
            return
        campaign = Campaign.objects.select_related("requested_by", "approved_plan").get(pk=campaign_id)
        facts = {**_campaign_facts(campaign), "state": STATE_AFTER[kind], "evidence": {"kind": kind, "seq": seq,
                 "hash": hash, "actor": actor, "at": at, "data": data}}
        emit(EventType.CAMPAIGN_STATE, f"campaign:{hash}", f"campaign:{campaign_id}",
             f"Campaign {campaign.name} is {STATE_AFTER[kind]} ({kind} by {actor})", facts)
        if kind == EvidenceKind.PLANNED:
            emit(EventType.APPROVAL_REQUESTED, f"approval:{hash}", f"campaign:{campaign_id}",
                 f"Campaign {campaign.name}: plan {facts['plan_version']} waits for {campaign.approvals_required} "
                 "approval(s)", facts)
    elif sweep_id is not None and kind in NODE_FAILURES:
        if not _listened(EventType.NODE_FAILED) or not EvidenceEvent.objects.filter(hash=hash).exists():
            return  # nobody listens, or the event lost its race and was never saved
        sweep = NodeSweep.objects.select_related("node__cluster", "campaign").get(pk=sweep_id)
        emit(EventType.NODE_FAILED, f"node-failed:{hash}", f"node:{sweep.node_id}",
             f"Node {sweep.node.name} failed in campaign {sweep.campaign.name}: {str(data.get('error', ''))[:150]}",
             {"node": sweep.node.name, "cluster": sweep.node.cluster.name, "campaign": sweep.campaign_id,
              "campaign_name": sweep.campaign.name, "sweep": sweep_id, "state": sweep.state, "error": sweep.error,
              "evidence": {"kind": kind, "seq": seq, "hash": hash, "actor": actor, "at": at, "data": data},
              "stranded_workloads": list(data.get("stranded_workloads") or []),
              "released_workloads": list(data.get("workloads_released") or []),
              "url": absolute(f"/campaigns/{sweep.campaign_id}/")})


def on_advisories_matched(advisory_ids: list[int]) -> None:
    if not advisory_ids or not _listened(EventType.ADVISORY_INGESTED):
        return
    per_cluster: dict[int, dict[str, int]] = {}
    for row in (Exposure.objects.filter(advisory_id__in=advisory_ids, state__in=LIVE)
                .values("advisory_id", "node__cluster__name").annotate(n=Count("id")).order_by()):
        per_cluster.setdefault(row["advisory_id"], {})[row["node__cluster__name"]] = row["n"]
    for advisory in Advisory.objects.filter(pk__in=per_cluster).prefetch_related("cves"):
        clusters = per_cluster[advisory.pk]
        emit(EventType.ADVISORY_INGESTED, f"advisory:{advisory.public_id}:{advisory.tracking_version}",
             f"advisory:{advisory.public_id}",
             f"{advisory.publisher} {advisory.publisher_id} ({advisory.severity}) affects {sum(clusters.values())} "
             f"exposures: {advisory.title}"[:300],
             {"advisory": advisory.public_id, "title": advisory.title, "severity": advisory.severity,
              "tracking_version": advisory.tracking_version, "cves": [c.cve_id for c in advisory.cves.all()],
              "integrity": advisory.integrity, "exposures_by_cluster": clusters,
              "url": absolute(f"/advisories/{advisory.public_id}/")})


def scan_deadlines(now: datetime | None = None) -> int:
    """Emit overdue and due-soon events per advisory and cluster; returns how many were new."""
    if not _listened(EventType.EXPOSURE_OVERDUE, EventType.EXPOSURE_DUE_SOON):
        return 0
    now = now or timezone.now()
    soon = now + timedelta(days=settings.GPUSWEEP_WEBHOOK_DUE_SOON_DAYS)
    emitted = 0
    for kind, window in ((EventType.EXPOSURE_OVERDUE, {"deadline__lt": now}),
                         (EventType.EXPOSURE_DUE_SOON, {"deadline__gte": now, "deadline__lt": soon})):
        groups = (Exposure.objects.filter(state=ExposureState.OPEN, **window)
                  .values("advisory_id", "advisory__publisher", "advisory__publisher_id", "advisory__severity",
                          "node__cluster_id",
                          "node__cluster__name").annotate(n=Count("id"), first=Min("deadline")).order_by())
        for group in groups:
            nodes = list(Exposure.objects.filter(state=ExposureState.OPEN, advisory_id=group["advisory_id"],
                                                 node__cluster_id=group["node__cluster_id"], **window)
                         .order_by("deadline", "node__name").values_list("node__name", flat=True)[:SAMPLE])
            word = "overdue since" if kind == EventType.EXPOSURE_OVERDUE else "due by"
            first = group["first"].date()
            advisory = public_id(group["advisory__publisher"], group["advisory__publisher_id"])
            # The advisory by its public id, in the key too (the events API shows it): never its database id.
            event = emit(kind, f"{kind}:{advisory}:{group['node__cluster_id']}:{first}", f"advisory:{advisory}",
                         f"{group['n']} exposures to {advisory} in "
                         f"{group['node__cluster__name']} {word} {first}",
                         {"advisory": advisory, "severity": group["advisory__severity"],
                          "cluster": group["node__cluster__name"], "exposures": group["n"],
                          "earliest_deadline": group["first"], "nodes": nodes,
                          "url": absolute(f"/advisories/exposures/?advisory={advisory}")})
            emitted += event is not None
    return emitted
