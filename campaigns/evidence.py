"""The tamper-evident evidence log: a chain per node sweep, a short chain per campaign, signed heads.

- A node event (admitted, each step, each workload move, done/failed) goes into its sweep's own
  chain. Appending locks that sweep's row only, so nodes of one campaign never wait for each other.
- A campaign event (created, planned, approved, started, paused, completed ...) goes into the
  campaign's chain; appending needs the campaign row locked by the caller (``lock_campaign``).
- Each event's ``hash = sha256(prev_hash + canonical JSON of its body)`` (``campaigns.verify``
  holds the one definition); the newest number and hash of every chain are kept on its row, so
  removing the last event is as visible as editing one in the middle.
- Heads are signed with an Ed25519 key that is not in the database (``campaigns.signing``): each
  node sweep's head when the sweep ends, and a seal of the campaign head with every node head
  (their Merkle root) when the campaign completes, when asked, and at each export. A rewritten
  chain with recomputed hashes no longer matches what was signed.
- ``export`` gives the auditor's JSON, which ``python -m campaigns.verify`` checks with no database;
  ``verify_campaign`` runs the same check on the stored log.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from campaigns import digests, queries, signing, verify
from campaigns.choices import EvidenceKind, SweepState
from campaigns.models import Campaign, EvidenceEvent, EvidenceSeal, NodeSweep
from campaigns.signals import evidence_recorded
from gpusweep.db.reads import select_rows


def _normal(data: dict[str, Any]) -> dict[str, Any]:
    # What is hashed must be exactly what the database gives back: JSON types only.
    loaded: dict[str, Any] = json.loads(json.dumps(data, cls=DjangoJSONEncoder))
    return loaded


def stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def body_of(event: EvidenceEvent) -> dict[str, Any]:
    seq = event.seq if event.sweep_id is None else event.node_seq
    return verify.event_body(event.campaign_id, event.sweep_id, int(seq or 0), event.kind, event.actor,
                             stamp(event.at), event.data)


# What the execution engine reads from a locked campaign: loading only these keeps a lock cheap.
LIGHT_FIELDS = ("id", "status", "evidence_seq", "evidence_head", "step_timeout_s", "error_budget")


def lock_campaign(campaign_id: int, light: bool = False) -> Campaign:
    """Lock the campaign row for the rest of the transaction (no-op on SQLite, whose writes serialize)."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_campaign must run inside transaction.atomic()")
    rows = Campaign.objects.select_for_update()
    if light:
        rows = rows.only(*LIGHT_FIELDS)
    return rows.get(pk=campaign_id)


def campaign_event(campaign: Campaign, kind: str, actor: str, data: dict[str, Any] | None = None) -> EvidenceEvent:
    """Append to the campaign's chain; `campaign` must come from lock_campaign in this transaction."""
    if kind not in EvidenceKind.CAMPAIGN:
        raise ValueError(f"{kind!r} is not a campaign-level evidence kind")
    event = EvidenceEvent(campaign_id=campaign.pk, seq=campaign.evidence_seq + 1, kind=kind, actor=actor[:200],
                          at=timezone.now(), data=_normal(data or {}), prev_hash=campaign.evidence_head)
    event.hash = verify.chain_hash(event.prev_hash, body_of(event))
    event.save(force_insert=True)
    announce(event)
    Campaign.objects.filter(pk=campaign.pk).update(evidence_seq=event.seq, evidence_head=event.hash)
    campaign.evidence_seq, campaign.evidence_head = event.seq or 0, event.hash
    return event


def prepare_node_event(campaign_id: int, sweep_id: int, seq: int, head: str, kind: str, actor: str,
                       data: dict[str, Any] | None = None) -> EvidenceEvent:
    """Number seq + 1 of a node chain whose head is `head`, hashed, not yet saved.

    The caller writes the sweep's new head (``event.node_seq``, ``event.hash``) in the same
    conditional UPDATE that changes the sweep's state, then saves the event: one statement saved
    per step, and the unique (sweep, node_seq) constraint makes two writers of one chain impossible.
    """
    if kind not in EvidenceKind.NODE:
        raise ValueError(f"{kind!r} is not a node-level evidence kind")
    event = EvidenceEvent(campaign_id=campaign_id, sweep_id=sweep_id, node_seq=seq + 1, kind=kind, actor=actor[:200],
                          at=timezone.now(), data=_normal(data or {}), prev_hash=head)
    event.hash = verify.chain_hash(head, body_of(event))
    announce(event)
    return event


def announce(event: EvidenceEvent) -> None:
    """Send evidence_recorded for `event` when the caller's transaction commits (campaigns.signals)."""
    fields = {"campaign_id": event.campaign_id, "sweep_id": event.sweep_id, "kind": event.kind,
              "seq": event.seq if event.sweep_id is None else event.node_seq, "hash": event.hash,
              "actor": event.actor, "at": event.at, "data": event.data}
    transaction.on_commit(lambda: evidence_recorded.send(sender=EvidenceEvent, **fields))


def node_event(sweep: NodeSweep, kind: str, actor: str, data: dict[str, Any] | None = None) -> EvidenceEvent:
    """Append to a node sweep's chain, from the head `sweep` carries (inside the caller's transaction).

    Whoever holds the sweep's lease (or the campaign lock, for a sweep nobody works on) is its only
    writer, so the head it read is current; a stale writer fails on the unique (sweep, node_seq)
    constraint and its transaction rolls back.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("node_event must run inside transaction.atomic()")
    event = prepare_node_event(sweep.campaign_id, sweep.pk, sweep.evidence_seq, sweep.evidence_head, kind, actor,
                               data)
    event.save(force_insert=True)
    NodeSweep.objects.filter(pk=sweep.pk).update(evidence_seq=event.node_seq, evidence_head=event.hash)
    sweep.evidence_seq, sweep.evidence_head = event.node_seq or 0, event.hash
    return event


def head_signature(campaign_id: int, sweep_id: int, seq: int, head: str) -> str:
    """The stored form of a finished node chain's signed head: key id, head, signature; also appended to
    the digest store, after the digests' history is found still in the database (else DigestMismatch)."""
    digests.check_history(campaign_id, stored_head_at(campaign_id))
    body = verify.node_head_body(campaign_id, sweep_id, seq, head)
    signature = signing.sign(verify.seal_message(body))
    digests.record_after_commit(campaign_id, "node_head", body, signature, signing.key_id())
    return f"{signing.key_id()}:{head}:{signature}"


def stored_head_at(campaign_id: int) -> Any:
    """head_at(chain, seq): the stored hash of event `seq` of a chain of the campaign (None: its own)."""
    def head_at(chain: int | None, seq: int) -> str:
        if seq == 0:
            return ""
        # Plain SQL: the signer looks a head up before every signature it gives.
        rows = (select_rows(EvidenceEvent, ("hash",), queries.CAMPAIGN_EVENT, [campaign_id, seq], prepared=True)
                if chain is None else
                select_rows(EvidenceEvent, ("hash",), queries.NODE_EVENT, [campaign_id, chain, seq], prepared=True))
        return str((rows[0][0] if rows else None) or "<missing>")
    return head_at


def sign_node_head(sweep: NodeSweep) -> None:
    """Sign the node chain's current head (the sweep has ended); inside the transaction that ended it."""
    NodeSweep.objects.filter(pk=sweep.pk).update(
        signed_seq=sweep.evidence_seq,
        head_signature=head_signature(sweep.campaign_id, sweep.pk, sweep.evidence_seq, sweep.evidence_head))


def _seal_body(campaign: Campaign, number: int, reason: str, now: datetime) -> dict[str, Any]:
    heads = [[sweep_id, seq, head] for sweep_id, seq, head in NodeSweep.objects.filter(campaign=campaign)
             .order_by("pk").values_list("pk", "evidence_seq", "evidence_head")]
    return {"format": verify.FORMAT, "campaign": campaign.pk, "number": number, "reason": reason, "at": stamp(now),
            "campaign_seq": campaign.evidence_seq, "campaign_head": campaign.evidence_head, "nodes": heads,
            "root": verify.merkle_root(heads)}


def _next_seal_number(campaign: Campaign) -> int:
    # Counted from the campaign chain, where every seal leaves a "sealed" event in the transaction
    # that stores it: a seal row deleted later leaves a gap instead of having its number reused.
    recorded = EvidenceEvent.objects.filter(campaign=campaign, sweep__isnull=True, kind=EvidenceKind.SEALED).count()
    stored = EvidenceSeal.objects.filter(campaign=campaign).aggregate(n=Max("number"))["n"] or 0
    return max(recorded, stored) + 1


def seal(campaign: Campaign, reason: str, actor: str = "system") -> EvidenceSeal:
    """Sign the campaign head together with every node head; `campaign` locked by the caller.

    The seal is then recorded in the campaign chain itself ("sealed"), so a removed seal shows.
    """
    digests.check_history(campaign.pk, stored_head_at(campaign.pk))
    number = _next_seal_number(campaign)
    now = timezone.now()
    body = _seal_body(campaign, number, reason, now)
    sealed = EvidenceSeal.objects.create(campaign=campaign, number=number, at=now, reason=reason, body=body,
                                         signature=signing.sign(verify.seal_message(body)), key_id=signing.key_id())
    digests.record_after_commit(campaign.pk, "seal", body, sealed.signature, sealed.key_id)
    campaign_event(campaign, EvidenceKind.SEALED, actor, {"seal": number, "reason": reason, "root": body["root"],
                                                          "campaign_seq": body["campaign_seq"],
                                                          "nodes": len(body["nodes"])})
    return sealed


def _export_events(campaign: Campaign) -> list[dict[str, Any]]:
    events = []
    for event in EvidenceEvent.objects.filter(campaign=campaign).select_related("sweep__node").order_by("at", "id"):
        events.append({
            "sweep": event.sweep_id, "node": event.sweep.node.name if event.sweep else None,
            "seq": event.seq if event.sweep_id is None else event.node_seq, "kind": event.kind,
            "actor": event.actor, "at": stamp(event.at), "data": event.data, "prev_hash": event.prev_hash,
            "hash": event.hash,
        })
    return events


def _export_sweeps(campaign: Campaign) -> list[dict[str, Any]]:
    sweeps = []
    for sweep in NodeSweep.objects.filter(campaign=campaign).select_related("node").order_by("pk"):
        entry: dict[str, Any] = {"id": sweep.pk, "node": sweep.node.name, "state": sweep.state,
                                 "finished": sweep.state in SweepState.TERMINAL,
                                 "evidence_seq": sweep.evidence_seq, "evidence_head": sweep.evidence_head,
                                 "signed_head": None}
        if sweep.head_signature and sweep.signed_seq is not None:
            key, head, signature = [*sweep.head_signature.split(":", 2), "", ""][:3]
            entry["signed_head"] = {"seq": sweep.signed_seq, "head": head, "signature": signature, "key_id": key}
        sweeps.append(entry)
    return sweeps


def build_export(campaign: Campaign) -> dict[str, Any]:
    """The stored log in the auditor's format (no new seal)."""
    campaign.refresh_from_db(fields=["evidence_seq", "evidence_head", "status", "name"])
    return {
        "format": verify.FORMAT,
        "campaign": {"id": campaign.pk, "name": campaign.name, "status": campaign.status,
                     "evidence_seq": campaign.evidence_seq, "evidence_head": campaign.evidence_head},
        "sweeps": _export_sweeps(campaign),
        "events": _export_events(campaign),
        "seals": [{"number": s.number, "reason": s.reason, "at": stamp(s.at), "body": s.body,
                   "signature": s.signature, "key_id": s.key_id}
                  for s in EvidenceSeal.objects.filter(campaign=campaign).order_by("number")],
        "public_key": signing.public_key_pem(),
        "key_id": signing.key_id(),
        "verify_with": "python -m campaigns.verify EXPORT.json --public-key KEY.pem",
    }


def export(campaign_id: int, actor: str = "system") -> dict[str, Any]:
    """Seal the current heads (an on-demand seal, recorded), then export the whole log."""
    with transaction.atomic():
        campaign = lock_campaign(campaign_id)
        seal(campaign, "export", actor)
    return build_export(Campaign.objects.get(pk=campaign_id))


def export_for_reading(campaign_id: int) -> dict[str, Any]:
    """The export a GET answers: nothing written. Events after the newest stored seal (a campaign
    still running) are covered by an "export" seal signed now and not stored, unless the digest store
    shows the database rewritten (then nothing new is signed and the check says why)."""
    campaign = Campaign.objects.get(pk=campaign_id)
    exported = build_export(campaign)
    try:
        digests.check_history(campaign_id, stored_head_at(campaign_id))
    except digests.DigestMismatch:
        return exported
    exported["seals"].append(_unsaved_seal(campaign, _next_seal_number(campaign), "export"))
    return exported


def verify_campaign(campaign: Campaign) -> list[str]:
    """Every problem in the stored log, found by the same check an auditor runs on an export, and
    against the digest store (when it holds this campaign's digests)."""
    exported = build_export(campaign)
    # Events after the newest stored seal (a campaign still running) are checked against a seal of
    # the current heads made now and not stored; the stored seals still pin everything before.
    exported["seals"].append(_unsaved_seal(campaign, _next_seal_number(campaign)))
    public_key = signing.private_key().public_key()
    problems = verify.verify_export(exported, public_key)
    recorded = digests.store().read(campaign.pk)
    return problems + (verify.check_digests(exported, recorded, public_key) if recorded else [])


def _unsaved_seal(campaign: Campaign, number: int, reason: str = "check") -> dict[str, Any]:
    """A seal of the current heads, signed now and stored nowhere (``stored``: false; no digest)."""
    body = _seal_body(campaign, number, reason, timezone.now())
    return {"number": number, "reason": reason, "at": body["at"], "body": body, "stored": False,
            "signature": signing.sign(verify.seal_message(body)), "key_id": signing.key_id()}
