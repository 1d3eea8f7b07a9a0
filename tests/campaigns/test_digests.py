"""Issue 28 item 2: evidence anchored outside the database (the digest store) and no write on a GET.

The laundering sequence of the issue, done as a database writer would: rewrite versions_before of a
completed campaign, delete its last two node events, its seals and its completed events, re-hash the
chains, set the sweep back to returning and redrive. Before the digest store the engine signed the
rewritten log again and every check said intact; now the signer refuses and the checks name it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from campaigns import digests, evidence, signing, verify
from campaigns.choices import CampaignStatus, EvidenceKind, SweepState
from campaigns.models import Campaign, EvidenceEvent, EvidenceSeal, NodeSweep
from tests.campaigns.fleet import completed_campaign, drive
from tests.helpers import REPO

pytestmark = pytest.mark.django_db
E = EvidenceEvent._meta.db_table


@pytest.fixture
def completed(django_capture_on_commit_callbacks) -> Campaign:  # type: ignore[no-untyped-def]
    return completed_campaign(django_capture_on_commit_callbacks)


def _rehash(campaign_id: int, sweep_id: int | None) -> tuple[int, str]:
    """Recompute a chain's hashes from what the rows now hold, as the launderer does; (last seq, head)."""
    rows = EvidenceEvent.objects.filter(campaign_id=campaign_id, sweep_id=sweep_id)
    prev, seq = "", 0
    with connection.cursor() as cursor:
        for event in rows.order_by("node_seq" if sweep_id else "seq"):
            seq = int((event.node_seq if sweep_id else event.seq) or 0)
            body = verify.event_body(campaign_id, sweep_id, seq, event.kind, event.actor, evidence.stamp(event.at),
                                     event.data)
            digest = verify.chain_hash(prev, body)
            cursor.execute(f"UPDATE {E} SET prev_hash = %s, hash = %s WHERE id = %s", [prev, digest, event.pk])
            prev = digest
    return seq, prev


def _launder(campaign: Campaign) -> NodeSweep:
    sweep = NodeSweep.objects.filter(campaign=campaign).order_by("pk").first()
    assert sweep is not None
    events = list(EvidenceEvent.objects.filter(sweep=sweep).order_by("node_seq"))
    for event in events:
        if "versions_before" in event.data:
            event.data["versions_before"] = {"driver": "999.99.99"}
            EvidenceEvent.objects.filter(pk=event.pk).update(data=event.data)
    for event in events[-2:]:
        EvidenceEvent.objects.filter(pk=event.pk)._raw_delete(connection.alias)
    EvidenceSeal.objects.filter(campaign=campaign)._raw_delete(connection.alias)
    EvidenceEvent.objects.filter(campaign=campaign, sweep__isnull=True,
                                 kind__in=[EvidenceKind.SEALED, EvidenceKind.COMPLETED])._raw_delete(connection.alias)
    seq, head = _rehash(campaign.pk, sweep.pk)
    NodeSweep.objects.filter(pk=sweep.pk).update(evidence_seq=seq, evidence_head=head, state=SweepState.RETURNING,
                                                 head_signature="", signed_seq=None,
                                                 versions_before={"driver": "999.99.99"})
    seq, head = _rehash(campaign.pk, None)
    Campaign.objects.filter(pk=campaign.pk).update(evidence_seq=seq, evidence_head=head,
                                                   status=CampaignStatus.RUNNING, finished_at=None)
    return sweep


def _offline(tmp_path: Path, export: dict, digest_file: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "export.json").write_text(json.dumps(export))
    (tmp_path / "key.pem").write_text(signing.public_key_pem())
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    return subprocess.run([sys.executable, "-m", "campaigns.verify", str(tmp_path / "export.json"), "--public-key",
                           str(tmp_path / "key.pem"), "--digests", str(digest_file)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_an_honest_campaign_matches_its_digests_offline_and_in_the_database(completed, tmp_path):
    recorded = digests.store().read(completed.pk)
    kinds = [d["kind"] for d in recorded]
    assert kinds.count("node_head") == 2 and kinds[-1] == "seal" and not verify.digest_problems(recorded)
    assert evidence.verify_campaign(completed) == []
    store = digests.FolderStore(Path(str(digests.store().folder)))  # type: ignore[attr-defined]
    result = _offline(tmp_path, evidence.export_for_reading(completed.pk), store.path(completed.pk))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_laundering_sequence_is_refused_by_the_signer_and_named_by_every_check(
        completed, tmp_path, django_capture_on_commit_callbacks):
    _launder(completed)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(digests.DigestMismatch, match="refusing"):
        drive(completed.pk)  # the redrive: the engine finishes the step, then the signer refuses
    assert not EvidenceSeal.objects.filter(campaign=completed).exists()  # nothing re-sealed
    problems = evidence.verify_campaign(Campaign.objects.get(pk=completed.pk))
    assert any("digest" in p and "no longer has the head" in p for p in problems), problems
    store = digests.FolderStore(Path(str(digests.store().folder)))  # type: ignore[attr-defined]
    result = _offline(tmp_path, evidence.export_for_reading(completed.pk), store.path(completed.pk))
    assert result.returncode == 1 and "digest" in result.stdout, result.stdout
    # The store itself is append-only and chained: a line edited there shows too.
    lines = store.path(completed.pk).read_text().splitlines()
    edited = json.loads(lines[0])
    edited["record"]["head"] = "0" * 64
    assert verify.digest_problems([edited] + [json.loads(line) for line in lines[1:]])


def test_a_get_of_evidence_writes_nothing_and_sealing_is_a_post(completed, make_user):
    viewer, operator = Client(), Client(enforce_csrf_checks=True)
    viewer.force_login(make_user("vera", "viewer"))
    operator.force_login(make_user("olga", "operator"))
    before = (EvidenceSeal.objects.count(), EvidenceEvent.objects.count())
    for _ in range(3):
        assert viewer.get(f"/campaigns/{completed.pk}/evidence.json").json()["verified"] is True
        assert viewer.get(f"/api/v1/campaigns/campaigns/{completed.pk}/evidence/").json()["intact"] is True
        assert viewer.get(f"/campaigns/{completed.pk}/report.json").status_code == 200
    assert (EvidenceSeal.objects.count(), EvidenceEvent.objects.count()) == before
    assert viewer.post(f"/api/v1/campaigns/campaigns/{completed.pk}/seal/").status_code == 403
    assert operator.post(f"/campaigns/{completed.pk}/seal/").status_code == 403  # no CSRF token: refused
    assert EvidenceSeal.objects.count() == before[0]
    trusted = Client()
    trusted.force_login(make_user("abe", "approver"))
    assert 'id="seal"' in trusted.get(f"/campaigns/{completed.pk}/").content.decode()
    assert 'id="seal"' not in viewer.get(f"/campaigns/{completed.pk}/").content.decode()
    assert trusted.post(f"/campaigns/{completed.pk}/seal/").status_code == 302
    assert EvidenceSeal.objects.count() == before[0] + 1


def test_a_store_edited_after_the_signer_read_it_is_still_refused(completed):
    """The signer reads the store before every signature and parses only what was appended since
    (FolderStore.read, check_history): a line edited in place, or a forged line appended, after a
    check that passed is still found."""
    store = digests.FolderStore(Path(str(digests.store().folder)))  # type: ignore[attr-defined]
    path = store.path(completed.pk)
    honest = path.read_bytes()
    digests.check_history(completed.pk, evidence.stored_head_at(completed.pk))  # intact: passes, and is cached
    first = json.loads(honest.splitlines()[0])
    head = first["record"]["head"]
    path.write_bytes(honest.replace(head.encode(), ("0" if head[0] != "0" else "1").encode() + head[1:].encode(), 1))
    with pytest.raises(digests.DigestMismatch, match="store edited"):
        digests.check_history(completed.pk, evidence.stored_head_at(completed.pk))
    last = json.loads(honest.splitlines()[-1])
    forged = {**last, "n": last["n"] + 1, "prev": last["digest"], "digest": "f" * 64}
    path.write_bytes(honest + digests.line_of(forged))
    with pytest.raises(digests.DigestMismatch, match=f"digest #{forged['n']}: its hash does not match"):
        digests.check_history(completed.pk, evidence.stored_head_at(completed.pk))
    path.write_bytes(honest)
    digests.check_history(completed.pk, evidence.stored_head_at(completed.pk))


def test_a_read_never_sees_half_of_an_append(tmp_path):
    """A signer reads the folder store while other workers append to it (threads here, as in
    bench/sweep.py): a line crossing a page boundary must not be read half written."""
    import threading

    store = digests.FolderStore(tmp_path)
    record = {"campaign": 9, "head": "ab" * 32, "filler": "x" * 20_000}  # each line crosses pages
    done = threading.Event()

    def write() -> None:
        try:
            for _ in range(200):
                store.append(9, "node_head", record, "sig", "key")
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    reads = 0
    while not done.is_set():
        entries = store.read(9)  # raised JSONDecodeError on a half-written line before the shared lock
        assert [e["n"] for e in entries] == list(range(1, len(entries) + 1))
        reads += 1
    writer.join()
    assert len(store.read(9)) == 200 and not verify.digest_problems(store.read(9)) and reads > 1
