"""Evidence per node, signed heads, and the standalone verifier an auditor runs (issue 11).

Each tampering is done the way someone with write access to the database would: raw SQL, and
for the rewrite, hashes recomputed with the same functions the service uses. The stored log is
checked with `manage.py verify_evidence` and a fresh export with `python -m campaigns.verify`
in a separate process that has no Django settings and no database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from campaigns import evidence, services, signing, verify
from campaigns.choices import CampaignStatus, EvidenceKind
from campaigns.models import Campaign, EvidenceEvent, EvidenceSeal, NodeSweep
from tests.campaigns.fleet import approved_campaign, drive, make_fleet, user
from tests.helpers import REPO

pytestmark = pytest.mark.django_db
E = EvidenceEvent._meta.db_table
S = NodeSweep._meta.db_table


@pytest.fixture
def campaign() -> Campaign:
    make_fleet(nodes=2, spares=2)
    requester, approver = user("rita", "operator"), user("alan", "approver")
    planned = approved_campaign(requester, approver)
    services.start(planned.pk, requester)
    done = drive(planned.pk)
    assert done.status == CampaignStatus.COMPLETED
    return done


def _standalone(tmp_path: Path, export: dict, key_pem: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m campaigns.verify` as an auditor runs it: no settings, no database."""
    (tmp_path / "export.json").write_text(json.dumps(export))
    (tmp_path / "key.pem").write_text(key_pem or signing.public_key_pem())
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    return subprocess.run([sys.executable, "-m", "campaigns.verify", str(tmp_path / "export.json"),
                           "--public-key", str(tmp_path / "key.pem")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def _node_events(campaign: Campaign) -> list[EvidenceEvent]:
    sweep = NodeSweep.objects.filter(campaign=campaign).order_by("pk").first()
    return list(EvidenceEvent.objects.filter(sweep=sweep).order_by("node_seq"))


def test_an_untouched_export_verifies_offline_and_not_with_another_key(campaign, tmp_path):
    call_command("verify_evidence", campaign=campaign.pk)
    export = evidence.export(campaign.pk)
    # Per node a chain of its own, a short campaign chain, and the heads signed.
    chains = {e["sweep"] for e in export["events"]}
    assert chains == {None, *NodeSweep.objects.filter(campaign=campaign).values_list("pk", flat=True)}
    assert [s["reason"] for s in export["seals"]] == ["completed", "export"]
    assert all(s["signed_head"] for s in export["sweeps"])
    completed = next(e for e in export["events"] if e["kind"] == EvidenceKind.COMPLETED)
    heads = [[s["id"], s["evidence_seq"], s["evidence_head"]] for s in export["sweeps"]]
    assert completed["data"]["node_heads_root"] == verify.merkle_root(heads)
    result = _standalone(tmp_path, export)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "intact and signed" in result.stdout
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    refused = _standalone(tmp_path, export, other)
    assert refused.returncode == 1 and "signature not valid" in refused.stdout


def _edit(campaign: Campaign) -> None:
    event = _node_events(campaign)[2]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {E} SET actor = 'user:mallory' WHERE id = %s", [event.pk])


def _delete(campaign: Campaign) -> None:
    event = _node_events(campaign)[3]
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {E} WHERE id = %s", [event.pk])


def _reorder(campaign: Campaign) -> None:
    a, b = _node_events(campaign)[2:4]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {E} SET node_seq = 100000 WHERE id = %s", [a.pk])
        cursor.execute(f"UPDATE {E} SET node_seq = %s WHERE id = %s", [a.node_seq, b.pk])
        cursor.execute(f"UPDATE {E} SET node_seq = %s WHERE id = %s", [b.node_seq, a.pk])


def _insert(campaign: Campaign) -> None:
    """A forged event appended to a finished node's chain, correctly linked and hashed."""
    last = _node_events(campaign)[-1]
    body = verify.event_body(campaign.pk, last.sweep_id, (last.node_seq or 0) + 1, EvidenceKind.RESTORED,
                             "user:mallory", evidence.stamp(last.at), {"workload": "forged"})
    digest = verify.chain_hash(last.hash, body)
    EvidenceEvent.objects.create(campaign=campaign, sweep_id=last.sweep_id, node_seq=body["seq"], kind=body["kind"],
                                 actor=body["actor"], at=last.at, data=body["data"], prev_hash=last.hash,
                                 hash=digest)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {S} SET evidence_seq = %s, evidence_head = %s WHERE id = %s",
                       [body["seq"], digest, last.sweep_id])


def _rewrite(campaign: Campaign) -> None:
    """A whole node chain rewritten (one event's data changed) with every hash recomputed."""
    events = _node_events(campaign)
    prev = ""
    with connection.cursor() as cursor:
        for event in events:
            data = dict(event.data)
            if event.kind == EvidenceKind.RESTORED:
                data["to"] = "somewhere-else"
            body = verify.event_body(campaign.pk, event.sweep_id, event.node_seq or 0, event.kind, event.actor,
                                     evidence.stamp(event.at), data)
            digest = verify.chain_hash(prev, body)
            cursor.execute(f"UPDATE {E} SET data = %s, prev_hash = %s, hash = %s WHERE id = %s",
                           [json.dumps(data), prev, digest, event.pk])
            prev = digest
        cursor.execute(f"UPDATE {S} SET evidence_head = %s WHERE id = %s", [prev, events[0].sweep_id])
    # Even the node's own signature cannot be made again: the forger drops it.
    NodeSweep.objects.filter(pk=events[0].sweep_id).update(head_signature="", signed_seq=None)


def _delete_seal(campaign: Campaign) -> None:
    EvidenceSeal.objects.filter(campaign=campaign, reason="completed")._raw_delete(connection.alias)


TAMPERING: dict[str, tuple[Callable[[Campaign], None], str]] = {
    "edited": (_edit, "was edited"),
    "deleted": (_delete, "removed"),
    "reordered": (_reorder, "edited"),
    "inserted": (_insert, "inserted"),
    "chain rewritten": (_rewrite, "rewritten"),
    "seal removed": (_delete_seal, "seal"),
}


@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_each_kind_of_tampering_is_detected_in_the_database_and_offline(campaign, tmp_path, kind):
    tamper, expected = TAMPERING[kind]
    tamper(campaign)
    problems = evidence.verify_campaign(Campaign.objects.get(pk=campaign.pk))
    assert problems and any(expected in p for p in problems), problems
    with pytest.raises(CommandError, match="evidence verification failed"):
        call_command("verify_evidence", campaign=campaign.pk)
    # A fresh export (which seals what the database now holds) still fails offline.
    result = _standalone(tmp_path, evidence.export(campaign.pk))
    assert result.returncode == 1, result.stdout
    assert expected in result.stdout


def test_a_node_step_appends_to_its_own_chain_without_the_campaign_chain(campaign):
    own = EvidenceEvent.objects.filter(campaign=campaign, sweep__isnull=True)
    assert set(own.values_list("kind", flat=True)) <= EvidenceKind.CAMPAIGN
    assert {k for k in EvidenceEvent.objects.filter(campaign=campaign, sweep__isnull=False).values_list(
        "kind", flat=True)} <= EvidenceKind.NODE
    steps = EvidenceEvent.objects.filter(campaign=campaign, kind=EvidenceKind.STEP_DONE)
    assert {e.data["step"] for e in steps} == {"draining", "checkpointing", "migrating", "patching", "rebooting",
                                               "verifying", "returning"}
    # The campaign chain stays short: life-cycle events and seals only.
    assert own.count() <= 12
