"""Each wave's maintenance reservation, per cluster whose back end holds one
(executors.base.SupportsWaveReservations), kept in step with the waves by every dispatch."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from campaigns import evidence, policy
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState, in_place
from campaigns.engine.naming import node_ref
from campaigns.models import Campaign, EvidenceEvent, NodeSweep, Plan
from executors.base import ExecutorError, SupportsWaveReservations, get_executor
from inventory.models import Cluster

log = logging.getLogger("campaigns.engine")


def sync_reservations(campaign_id: int) -> None:
    """Each wave's maintenance reservation, per cluster whose back end holds one (``wave_reservation``):
    created once the wave has a working sweep, for the wave's nodes on that cluster and the plan's time
    for it; deleted once none of its sweeps is working any more, or the campaign is aborted.

    The back end's calls run outside any transaction and are idempotent; each creation and deletion is
    recorded once in the campaign's chain. A call that fails is logged and tried again by the next
    dispatch (the periodic re-drive dispatches every running campaign); the wave goes on meanwhile.
    """
    row = Campaign.objects.filter(pk=campaign_id).values_list("status", "limits").first()
    if row is None:
        return
    status, limits = row
    if (limits or {}).get("reservations") is False:
        return  # the approved plan lists none: nothing to create, so nothing to delete
    created: dict[tuple[int, int], dict[str, Any]] = {}
    deleted: set[tuple[int, int]] = set()
    for kind, data in EvidenceEvent.objects.filter(
            campaign_id=campaign_id, sweep__isnull=True,
            kind__in=[EvidenceKind.RESERVATION_CREATED, EvidenceKind.RESERVATION_DELETED]).values_list("kind", "data"):
        key = (int(data["cluster_id"]), int(data["wave"]))
        if kind == EvidenceKind.RESERVATION_CREATED:
            created[key] = data
        else:
            deleted.add(key)
    active = set(NodeSweep.objects.filter(campaign_id=campaign_id, state__in=SweepState.WORKING).order_by()
                 .values_list("node__cluster_id", "wave").distinct())
    aborted = status == CampaignStatus.ABORTED
    ending = [key for key in created if key not in deleted and (aborted or key not in active)]
    starting = [] if status not in (CampaignStatus.RUNNING, CampaignStatus.WAITING) else sorted(
        key for key in active if key not in created)
    if not ending and not starting:
        return
    clusters = Cluster.objects.in_bulk({key[0] for key in [*ending, *starting]})
    for cluster_id, wave in ending:
        data = created[(cluster_id, wave)]
        try:
            ex = get_executor(clusters[cluster_id])
            if isinstance(ex, SupportsWaveReservations):  # else it holds none: nothing to delete
                ex.release_wave(data["name"])
        except ExecutorError as exc:
            log.warning("campaign %s: deleting reservation %s failed: %s", campaign_id, data["name"], exc)
            continue
        _record_reservation(campaign_id, EvidenceKind.RESERVATION_DELETED, {
            "cluster_id": cluster_id, "cluster": data.get("cluster"), "wave": wave, "name": data["name"],
            "why": "campaign aborted" if aborted else "the wave ended"})
    for cluster_id, wave in starting:
        _reserve_wave(campaign_id, clusters[cluster_id], wave)


def _reserve_wave(campaign_id: int, cluster: Cluster, wave: int) -> None:
    try:
        ex = get_executor(cluster)
        if not isinstance(ex, SupportsWaveReservations):
            return  # this back end holds none
        name = ex.wave_reservation(campaign_id, wave)
        if not name:
            return  # none for this cluster's waves (its reservations are off)
        nodes = [node_ref(s.node) for s in NodeSweep.objects.filter(
            campaign_id=campaign_id, wave=wave, node__cluster=cluster).exclude(state=SweepState.SKIPPED)
            .select_related("node__cluster").order_by("node__name") if not in_place(s.target)]
        if not nodes:
            return  # a wave of livepatches only: its nodes keep taking work
        start, end = planned_wave_times(campaign_id, wave)
        now = timezone.now()
        minutes = policy.reservation_minutes(start, end, now)
        ex.reserve_wave(name, nodes, minutes)
    except ExecutorError as exc:
        log.warning("campaign %s: reserving wave %s on %s failed: %s", campaign_id, wave, cluster.name, exc)
        return
    _record_reservation(campaign_id, EvidenceKind.RESERVATION_CREATED, {
        "cluster_id": cluster.pk, "cluster": cluster.name, "wave": wave, "name": name,
        "nodes": [n.name for n in nodes], "minutes": minutes, "start": now.isoformat(),
        "end": (now + timedelta(minutes=minutes)).isoformat()})


def planned_wave_times(campaign_id: int, wave: int) -> tuple[Any, Any]:
    """The approved plan's start and end of `wave` (None, None when it has none)."""
    from django.utils.dateparse import parse_datetime

    plan_id = Campaign.objects.filter(pk=campaign_id).values_list("approved_plan_id", flat=True).first()
    waves = Plan.objects.filter(pk=plan_id).values_list("content__waves", flat=True).first() if plan_id else None
    entry: dict[str, Any] = next((w for w in waves or [] if w.get("wave") == wave), {})
    start, end = entry.get("start"), entry.get("end")
    return (parse_datetime(start) if start else None, parse_datetime(end) if end else None)


def _record_reservation(campaign_id: int, kind: str, data: dict[str, Any]) -> None:
    """The event, once: a dispatch running at the same time may have recorded it already."""
    with transaction.atomic():
        campaign = evidence.lock_campaign(campaign_id)
        if not EvidenceEvent.objects.filter(campaign_id=campaign_id, sweep__isnull=True, kind=kind,
                                            data__cluster_id=data["cluster_id"], data__wave=data["wave"]).exists():
            evidence.campaign_event(campaign, kind, "system", data)
