"""The tamper-evident evidence log.

Each event is hashed over the previous hash and its own canonical JSON (sorted keys, no spaces,
UTC timestamps with microseconds), once in its campaign's chain and once in its node sweep's
chain. The newest hash and sequence number of each chain are also kept on the campaign and the
sweep, so removing the last event is as visible as editing or reordering one in the middle.

Appending needs the campaign row locked (``lock_campaign``) in the caller's transaction: that
serializes the chain, and taking the campaign lock first everywhere keeps lock order fixed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from campaigns.models import Campaign, EvidenceEvent, NodeSweep


def canonical(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, cls=DjangoJSONEncoder)


def _normal(data: dict[str, Any]) -> dict[str, Any]:
    # What is hashed must be exactly what the database gives back.
    loaded: dict[str, Any] = json.loads(canonical(data))
    return loaded


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def event_body(event: EvidenceEvent) -> dict[str, Any]:
    return {
        "campaign": event.campaign_id, "seq": event.seq, "sweep": event.sweep_id, "node_seq": event.node_seq,
        "kind": event.kind, "actor": event.actor, "at": _stamp(event.at), "data": event.data,
    }


def chain_hash(prev: str, body: dict[str, Any]) -> str:
    return hashlib.sha256((prev + canonical(body)).encode()).hexdigest()


# What the execution engine reads from a locked campaign: loading only these keeps a step cheap.
LIGHT_FIELDS = ("id", "status", "evidence_seq", "evidence_head", "step_timeout_s", "error_budget")


def lock_campaign(campaign_id: int, light: bool = False) -> Campaign:
    """Lock the campaign row for the rest of the transaction (no-op on SQLite, whose writes serialize)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_campaign must run inside transaction.atomic()")
    rows = Campaign.objects.select_for_update()
    if light:
        rows = rows.only(*LIGHT_FIELDS)
    return rows.get(pk=campaign_id)


def append(
    campaign: Campaign, kind: str, actor: str, data: dict[str, Any] | None = None, sweep: NodeSweep | None = None
) -> EvidenceEvent:
    """Append one event; `campaign` must come from lock_campaign in the same transaction."""
    event = EvidenceEvent(
        campaign_id=campaign.pk, sweep_id=sweep.pk if sweep else None, seq=campaign.evidence_seq + 1,
        kind=kind, actor=actor[:200], at=timezone.now(), data=_normal(data or {}),
        prev_hash=campaign.evidence_head,
    )
    if sweep is not None:
        head = NodeSweep.objects.filter(pk=sweep.pk).values_list("evidence_seq", "evidence_head").get()
        event.node_seq = head[0] + 1
        event.node_prev_hash = head[1]
    body = event_body(event)
    event.hash = chain_hash(event.prev_hash, body)
    if sweep is not None:
        event.node_hash = chain_hash(event.node_prev_hash, body)
    event.save(force_insert=True)
    Campaign.objects.filter(pk=campaign.pk).update(evidence_seq=event.seq, evidence_head=event.hash)
    campaign.evidence_seq, campaign.evidence_head = event.seq, event.hash
    if sweep is not None:
        NodeSweep.objects.filter(pk=sweep.pk).update(evidence_seq=event.node_seq, evidence_head=event.node_hash)
        sweep.evidence_seq, sweep.evidence_head = event.node_seq or 0, event.node_hash
    return event


@dataclass(frozen=True)
class Problem:
    campaign: int
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = f"campaign {self.campaign}" + (f" event #{self.seq}" if self.seq is not None else "")
        return f"{where}: {self.message}"


def verify_campaign(campaign: Campaign) -> list[Problem]:
    """Every way the stored log differs from an untouched one: edited, removed or reordered events."""
    problems: list[Problem] = []
    prev, expected = "", 1
    node_heads: dict[int, tuple[int, str]] = {}
    for event in EvidenceEvent.objects.filter(campaign=campaign).order_by("seq", "id"):
        body = event_body(event)
        if event.seq != expected:
            problems.append(Problem(campaign.pk, event.seq, f"expected event #{expected}: events removed or reordered"))
        if event.prev_hash != prev:
            problems.append(Problem(campaign.pk, event.seq, "previous hash does not match: chain broken"))
        if chain_hash(event.prev_hash, body) != event.hash:
            problems.append(Problem(campaign.pk, event.seq, f"content of {event.kind!r} event was edited"))
        if event.sweep_id is not None:
            node_seq, node_prev = node_heads.get(event.sweep_id, (0, ""))
            if event.node_seq != node_seq + 1 or event.node_prev_hash != node_prev:
                problems.append(Problem(campaign.pk, event.seq, f"node sweep {event.sweep_id} chain broken"))
            if chain_hash(event.node_prev_hash, body) != event.node_hash:
                problems.append(Problem(campaign.pk, event.seq, f"node sweep {event.sweep_id} hash does not match"))
            node_heads[event.sweep_id] = (event.node_seq or 0, event.node_hash)
        prev, expected = event.hash, event.seq + 1
    if (campaign.evidence_seq, campaign.evidence_head) != (expected - 1, prev):
        problems.append(Problem(campaign.pk, None, f"log ends at #{expected - 1} but the campaign recorded "
                                                   f"#{campaign.evidence_seq}: events removed at the end"))
    for sweep in NodeSweep.objects.filter(campaign=campaign).only("pk", "evidence_seq", "evidence_head"):
        if node_heads.get(sweep.pk, (0, "")) != (sweep.evidence_seq, sweep.evidence_head):
            problems.append(Problem(campaign.pk, None, f"node sweep {sweep.pk} log does not end where recorded"))
    return problems
