"""Admission: which pending nodes start now (the window, the canary, the parallelism limits, the wave
order, which a node waiting for a receiver does not hold: policy.admits), and the campaign-level
work of a dispatch (waiting for a window, soaking, completing, sealing).

Only campaign-level work takes the campaign row lock: a dispatch does, a step never does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from campaigns import evidence, policy
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.engine import queries, rows
from campaigns.engine.reservations import sync_reservations
from campaigns.models import Campaign, EvidenceSeal, NodeSweep
from campaigns.planner import Calendar, parse_blackouts, parse_windows
from campaigns.queue import enqueue


def dispatch(campaign_id: int) -> list[int]:
    """Admit pending nodes within the window, the parallelism limits and the wave order."""
    now = timezone.now()
    sync_reservations(campaign_id)  # a wave that ended (or an abort) gives its reservation back first
    admitted = _dispatch(campaign_id, now)
    if admitted:
        sync_reservations(campaign_id)  # the waves admitted now get theirs
    return admitted


def _dispatch(campaign_id: int, now: Any) -> list[int]:
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        sweeps = NodeSweep.objects.filter(campaign=campaign)
        if campaign.status == CampaignStatus.ABORTED:
            _seal_when_at_rest(campaign, sweeps, "aborted")
            return []
        if campaign.status not in (CampaignStatus.RUNNING, CampaignStatus.WAITING):
            return []
        # Aggregates only: a dispatch costs the same for 10 nodes or 10,000. The wave order is held
        # by every active sweep but one waiting for a receiver (policy.admits); it keeps its slot.
        active, lowest = rows.waves(campaign.pk)
        if active is None:
            _complete(campaign, sweeps, now)
            return []
        if lowest is None or not _window_open(campaign, now):
            return []  # (every node left waits for a receiver: none pending, nothing to admit)
        upto = _canary_gate(campaign, sweeps, now)
        if upto == 0:
            return []
        admitted = _admit(campaign, sweeps, lowest, now, upto)
        for sweep_id in admitted:
            enqueue("advance", sweep_id)
        return admitted


def _window_open(campaign: Campaign, now: Any) -> bool:
    calendar = Calendar(parse_windows(campaign.windows or []), parse_blackouts(campaign.blackouts or []),
                        now, horizon_days=9)
    if not calendar.is_open(now):
        opens = calendar.earliest(now, timedelta(0))
        if campaign.status == CampaignStatus.RUNNING:
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.WAITING)
            campaign.status = CampaignStatus.WAITING
            evidence.campaign_event(campaign, EvidenceKind.WAITING_FOR_WINDOW, "system",
                                    {"next_window": opens.isoformat() if opens else None})
        if opens is not None:
            enqueue("dispatch", campaign.pk, min(300.0, max(1.0, (opens - now).total_seconds())))
        return False
    if campaign.status == CampaignStatus.WAITING:
        Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.RUNNING)
        campaign.status = CampaignStatus.RUNNING
        evidence.campaign_event(campaign, EvidenceKind.WINDOW_OPENED, "system", {})
    return True


def _canary_gate(campaign: Campaign, sweeps: Any, now: Any) -> int | None:
    """The highest wave that may start now because of the canary: 1 while it runs, 0 while it soaks
    (or failed, which halts the campaign), None once it soaked or when the plan has none."""
    limits = campaign.limits or {}
    if not limits.get("canary") or limits.get("soaked"):
        return None
    canary = sweeps.filter(wave=1)
    if canary.filter(state__in=SweepState.ACTIVE).exists():
        return 1
    soak = timedelta(seconds=int(limits.get("soak_s") or 0))
    if campaign.soak_started_at is None:
        campaign.soak_started_at = now
        failed = list(canary.filter(state__in=[SweepState.FAILED, SweepState.ROLLED_BACK]).values_list(
            "node__name", flat=True))
        Campaign.objects.filter(pk=campaign.pk).update(soak_started_at=now)
        if failed:
            # Nothing else has been drained: stop here for a human to look.
            reason = f"the canary failed on {', '.join(sorted(failed))}; no other node was drained"
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.HALTED, status_reason=reason)
            campaign.status = CampaignStatus.HALTED
            evidence.campaign_event(campaign, EvidenceKind.CANARY_FAILED, "system", {"failed": failed,
                                                                                     "reason": reason})
            return 0
        evidence.campaign_event(campaign, EvidenceKind.SOAKING, "system", {
            "canary": list(canary.values_list("node__name", flat=True)), "soak_s": soak.total_seconds(),
            "until": (now + soak).isoformat()})
    remaining = (campaign.soak_started_at + soak - now).total_seconds()
    if remaining > 0:
        enqueue("dispatch", campaign.pk, min(300.0, remaining + 0.5))
        return 0
    Campaign.objects.filter(pk=campaign.pk).update(limits={**limits, "soaked": True})
    campaign.limits = {**limits, "soaked": True}
    evidence.campaign_event(campaign, EvidenceKind.SOAKED, "system", {
        "soaked_s": (now - campaign.soak_started_at).total_seconds(),
        "canary": dict(canary.values_list("node__name", "state"))})
    return None


def _admit(campaign: Campaign, sweeps: Any, lowest: int, now: Any, upto: int | None = None) -> list[int]:
    limits = campaign.limits or {}
    cluster_limit: dict[str, int] = limits.get("cluster") or {}
    pool_limit: dict[str, int] | None = limits.get("pool")
    in_cluster: Counter[str] = Counter()
    in_pool: Counter[str] = Counter()
    for cluster, pool, count in sweeps.filter(state__in=SweepState.WORKING).values_list(
            "node__cluster__name", "node__pool").annotate(n=Count("id")).values_list(
            "node__cluster__name", "node__pool", "n"):
        in_cluster[cluster] += count
        in_pool[f"{cluster}/{pool}"] += count
    admitted: list[int] = []
    for row in _pending(sweeps, min(lowest + 1, upto or lowest + 1), cluster_limit, in_cluster):
        cluster, pool = row["node__cluster__name"], f"{row['node__cluster__name']}/{row['node__pool']}"
        if not policy.admits(row["wave"], lowest, in_cluster[cluster], cluster_limit.get(cluster, 1), in_pool[pool],
                             pool_limit.get(pool, 1) if pool_limit is not None else None):
            continue
        event = evidence.prepare_node_event(campaign.pk, row["id"], row["evidence_seq"], row["evidence_head"],
                                            EvidenceKind.ADMITTED, "system", {"wave": row["wave"]})
        moved = rows.update_sweep(row["id"], {
            # A livepatch goes straight to its patch: the node keeps its work (SweepState.steps_of).
            "state": SweepState.next(SweepState.PENDING, row["target"]), "lease_owner": "", "attempt": 0,
            "step_started_at": now,
            "step_deadline": policy.step_deadline(campaign.step_timeout_s, now),
            "evidence_seq": event.node_seq, "evidence_head": event.hash,
        }, queries.pending_guard())
        if moved:
            rows.insert_events([event])
            in_cluster[cluster] += 1
            in_pool[pool] += 1
            admitted.append(row["id"])
    return admitted


ADMIT_PAGE = 200


def _pending(sweeps: Any, upto: int, cluster_limit: dict[str, int],
             in_cluster: Counter[str]) -> Iterator[dict[str, Any]]:
    """Pending sweeps of waves up to `upto` in plan order, a page at a time, leaving out clusters
    already at their limit (re-read after each page, as admission fills them): a dispatch reads
    about as many rows as it may admit, not every pending row of two waves (10,000 nodes, issue 20)."""
    after: tuple[int, int, int] | None = None
    while True:
        full = [c for c, limit in cluster_limit.items() if in_cluster[c] >= limit]
        rows = sweeps.filter(state=SweepState.PENDING, wave__lte=upto).exclude(node__cluster__name__in=full)
        if after is not None:
            wave, position, pk = after
            rows = rows.filter(Q(wave__gt=wave) | Q(wave=wave, position__gt=position)
                               | Q(wave=wave, position=position, pk__gt=pk))
        page = list(rows.order_by("wave", "position", "pk").values(
            "id", "wave", "position", "node__cluster__name", "node__pool", "evidence_seq", "evidence_head",
            "target")
            [:ADMIT_PAGE])
        yield from page
        if len(page) < ADMIT_PAGE:
            return
        after = (page[-1]["wave"], page[-1]["position"], page[-1]["id"])


def _complete(campaign: Campaign, sweeps: Any, now: Any) -> None:
    counts = dict(sweeps.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.COMPLETED, finished_at=now)
    campaign.status = CampaignStatus.COMPLETED
    heads = list(sweeps.order_by("pk").values_list("pk", "evidence_seq", "evidence_head"))
    from campaigns.verify import merkle_root

    # The campaign's head now commits to every node chain's head; the seal signs both.
    evidence.campaign_event(campaign, EvidenceKind.COMPLETED, "system",
                            {"states": counts, "node_heads_root": merkle_root(heads), "nodes": len(heads)})
    evidence.seal(campaign, "completed")


def _seal_when_at_rest(campaign: Campaign, sweeps: Any, reason: str) -> None:
    if sweeps.filter(state__in=SweepState.WORKING).exists():
        return
    if not EvidenceSeal.objects.filter(campaign=campaign, reason=reason).exists():
        evidence.seal(campaign, reason)
