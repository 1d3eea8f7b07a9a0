"""The evidence digest store: every seal and signed node head also appended outside the database.

The database holds the evidence and its signatures, but a database writer could rewrite a finished
campaign's chains and let the engine sign them again (issue 28). So each signed record is appended,
once its transaction commits, to a per-campaign file of JSON lines chained by hash (``verify.digest_of``)
in GPUSWEEP_EVIDENCE_DIGEST_DIR (default ``var/evidence-digests``): a folder the database's users
cannot write, ideally on WORM storage or copied off-host. Before signing anything for a campaign the
signer checks that the database still holds the heads its latest digests pinned, and refuses
(``DigestMismatch``) when it does not. ``verify_campaign``, the API and ``python -m campaigns.verify
--digests`` check the evidence against these files.

Another backend (an object store with retention, S3 Object Lock say) is one class with ``read`` and
``append`` named by GPUSWEEP_EVIDENCE_DIGEST_STORE; the folder is the one built in.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from django.utils.module_loading import import_string

from campaigns import verify


class DigestMismatch(Exception):
    """The database no longer holds what the digest store says was signed: nothing more is signed."""


class DigestStore(Protocol):
    def read(self, campaign_id: int) -> list[dict[str, Any]]: ...

    def append(self, campaign_id: int, kind: str, record: dict[str, Any], signature: str, key_id: str) -> None: ...


class FolderStore:
    """One append-only file per campaign; appends are locked, written whole and fsynced."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, campaign_id: int) -> Path:
        return self.folder / f"campaign-{int(campaign_id)}.jsonl"

    def read(self, campaign_id: int) -> list[dict[str, Any]]:
        try:
            text = self.path(campaign_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def append(self, campaign_id: int, kind: str, record: dict[str, Any], signature: str, key_id: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(campaign_id), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # two workers sealing at once still make one chain
            existing = self.read(campaign_id)
            prev = str(existing[-1]["digest"]) if existing else ""
            entry: dict[str, Any] = {"n": len(existing) + 1, "kind": kind, "campaign": int(campaign_id),
                                     "record": record, "signature": signature, "key_id": key_id, "prev": prev}
            entry["digest"] = verify.digest_of(prev, entry)
            os.write(fd, (verify.canonical(entry) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def store() -> DigestStore:
    custom = getattr(settings, "GPUSWEEP_EVIDENCE_DIGEST_STORE", "")
    if custom:  # a deployment setting, never anything a user writes
        made: DigestStore = import_string(custom)()
        return made
    return FolderStore(Path(settings.GPUSWEEP_EVIDENCE_DIGEST_DIR))


def record_after_commit(campaign_id: int, kind: str, record: dict[str, Any], signature: str, key_id: str) -> None:
    """Append when the signing transaction commits: a rolled-back seal leaves no digest."""
    transaction.on_commit(lambda: store().append(campaign_id, kind, record, signature, key_id))


def check_history(campaign_id: int, head_at: Any) -> None:
    """Refuse to sign when the database lost a head the latest digests pinned.

    `head_at(chain, seq)` gives the stored hash of event `seq` of a chain (None: the campaign's).
    The newest digest and the newest seal digest are checked: a seal pins every chain at once.
    """
    digests = store().read(campaign_id)
    if not digests:
        return
    if problems := verify.digest_problems(digests):
        raise DigestMismatch(f"campaign {campaign_id}: {problems[0]}")
    latest_seal = next((d for d in reversed(digests) if d["kind"] == "seal"), None)
    for entry in {id(d): d for d in (digests[-1], latest_seal) if d is not None}.values():
        for chain, seq, head in verify.pinned_heads(entry):
            if head_at(chain, seq) != head:
                name = "its campaign chain" if chain is None else f"node sweep {chain}"
                raise DigestMismatch(f"campaign {campaign_id}: {name} no longer has the head signed at #{seq} "
                                     f"(digest #{entry['n']}): refusing to sign")
