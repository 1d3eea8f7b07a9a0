"""The evidence digest store: every seal and signed node head also appended outside the database.

The database holds the evidence and its signatures, but a database writer could rewrite a finished
campaign's chains and let the engine sign them again (issue 28). So each signed record is appended,
once its transaction commits, to a per-campaign file of JSON lines chained by hash (``verify.digest_of``)
in GPUSWEEP_EVIDENCE_DIGEST_DIR (default ``var/evidence-digests``): a folder the database's users
cannot write, ideally on WORM storage or copied off-host. Before signing anything for a campaign the
signer checks that the database still holds the heads its latest digests pinned, and refuses
(``DigestMismatch``) when it does not. ``verify_campaign``, the API and ``python -m campaigns.verify
--digests`` check the evidence against these files.

Another backend is one class with ``read`` and ``append``, made with no arguments, named by
GPUSWEEP_EVIDENCE_DIGEST_STORE. Two are built in: the folder (the default) and ``ObjectLockStore``, one
object per digest in an S3 bucket with Object Lock, each kept for a retention the deployment sets. Both
build their entries with ``next_entry``, so that the two cannot drift apart.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils.module_loading import import_string

from campaigns import verify


class DigestMismatch(Exception):
    """The database no longer holds what the digest store says was signed: nothing more is signed."""


class DigestConflict(Exception):
    """Other writers kept taking the next digest's number: nothing was appended."""


class DigestStore(Protocol):
    def read(self, campaign_id: int) -> list[dict[str, Any]]: ...

    def append(self, campaign_id: int, kind: str, record: dict[str, Any], signature: str, key_id: str) -> None: ...


def next_entry(existing: list[dict[str, Any]], campaign_id: int, kind: str, record: dict[str, Any], signature: str,
               key_id: str) -> dict[str, Any]:
    """The digest that follows `existing` (the campaign's digests, in order): numbered, chained, hashed."""
    prev = str(existing[-1]["digest"]) if existing else ""
    entry: dict[str, Any] = {"n": len(existing) + 1, "kind": kind, "campaign": int(campaign_id), "record": record,
                             "signature": signature, "key_id": key_id, "prev": prev}
    entry["digest"] = verify.digest_of(prev, entry)
    return entry


def line_of(entry: dict[str, Any]) -> bytes:
    """A digest as stored: one line of canonical JSON (a folder store's line, an object store's object)."""
    return (verify.canonical(entry) + "\n").encode()


def _whole_file(fd: int) -> bytes:
    with open(fd, "rb", closefd=False) as file:
        file.seek(0)
        return file.read()


def _entries(data: bytes) -> list[dict[str, Any]]:
    # The lines str.splitlines gives (as of the file read as text), blank ones skipped.
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


# Per process: each folder store file's bytes up to its last whole line, and the digests they hold
# (FolderStore.read), for at most _FOLDER_READ_MAX files (the campaigns a worker is signing for now;
# a 10,000-node campaign's digests are a few megabytes).
_FOLDER_READ: dict[Path, tuple[bytes, tuple[dict[str, Any], ...]]] = {}
_FOLDER_READ_MAX = 16
_FOLDER_LOCK = threading.Lock()
# Per process: the digests of each campaign check_history last found intact (the objects read).
_CHECKED: dict[int, tuple[dict[str, Any], ...]] = {}


class FolderStore:
    """One append-only file per campaign; appends are locked, written whole and fsynced."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, campaign_id: int) -> Path:
        return self.folder / f"campaign-{int(campaign_id)}.jsonl"

    def read(self, campaign_id: int) -> list[dict[str, Any]]:
        path = self.path(campaign_id)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return []
        try:
            # Shared with other readers, never with an append: a line crossing a page boundary is
            # otherwise seen half written (a signer then failed on JSON it could not parse).
            fcntl.flock(fd, fcntl.LOCK_SH)
            data = _whole_file(fd)
        finally:
            os.close(fd)
        return self._parsed(path, data)

    def _parsed(self, path: Path, data: bytes) -> list[dict[str, Any]]:
        # The file is only appended to: when it still starts with the bytes read last time, only what
        # follows is parsed (a signer reads it before every signature; parsing it whole each time made
        # a campaign's signing quadratic in its nodes). Any other change is read from the start.
        seen, entries = _FOLDER_READ.get(path, (b"", ()))
        if not data.startswith(seen):
            seen, entries = b"", ()
        whole = data.rfind(b"\n") + 1  # cached up to the last whole line; "\n" ends a line in any reading
        fresh = tuple(_entries(data[len(seen):whole])) if whole > len(seen) else ()
        if fresh:
            entries += fresh
            with _FOLDER_LOCK:
                if len(_FOLDER_READ) >= _FOLDER_READ_MAX:
                    _FOLDER_READ.clear()
                _FOLDER_READ[path] = (data[:whole], entries)
        return [*entries, *_entries(data[max(whole, len(seen)):])]

    def append(self, campaign_id: int, kind: str, record: dict[str, Any], signature: str, key_id: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(campaign_id), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # two workers sealing at once still make one chain
            entry = next_entry(self._parsed(self.path(campaign_id), _whole_file(fd)), campaign_id, kind, record,
                               signature, key_id)
            os.write(fd, line_of(entry))
            # The line is in place: the next append (another node's) need not wait for the disk too.
            # Still synced before returning; a file's fsync flushes all of it, earlier lines included.
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.fsync(fd)
        finally:
            os.close(fd)


# Per process, shared by every ObjectLockStore (store() makes one per call): an S3 client per endpoint,
# the buckets whose Object Lock was seen enabled, and the digests already read, by object version (a
# version's content never changes, and a locked one cannot be deleted, so a cached one stays true).
_S3_LOCK = threading.Lock()
_S3_CLIENTS: dict[str, Any] = {}
_S3_LOCKED_BUCKETS: set[tuple[str, str]] = set()
_S3_READ: dict[tuple[str, str, str, str], str] = {}
_S3_READ_MAX = 50_000


class ObjectLockStore:
    """One object per digest in an S3 bucket with Object Lock: ``<prefix>campaign-<id>/<n, 8 digits>.json``.

    Each object is the folder store's line for that digest, written once: ``If-None-Match: *`` (never
    over an existing entry; two writers that took the same number: the later one reads again and
    retries, up to ATTEMPTS times) with a retention (``ObjectLockMode``, COMPLIANCE by default, and
    ``ObjectLockRetainUntilDate`` now + GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS) and its SHA-256
    checksum, which S3 requires of an upload with a retention. In COMPLIANCE mode nobody, the
    account's root included, can delete that version or shorten its retention before the date; in
    GOVERNANCE mode a principal granted s3:BypassGovernanceRetention can.

    ``read`` lists the campaign's object versions and takes the first version of each key: a later
    version or a delete marker (someone with s3:PutObject or s3:DeleteObject) neither hides nor
    replaces a locked entry. Settings: GPUSWEEP_EVIDENCE_DIGEST_BUCKET (required), ``_ENDPOINT_URL``
    (an S3-compatible store; empty: AWS), ``_PREFIX``, ``_RETENTION_DAYS``, ``_RETENTION_MODE``.
    Credentials and region come only from boto3's own chain (AWS_* variables, a profile, an instance
    or pod role). The bucket's Object Lock is checked at first use (ImproperlyConfigured without it).
    """

    MODES = ("COMPLIANCE", "GOVERNANCE")
    ATTEMPTS = 5

    def __init__(self) -> None:
        self.bucket = str(getattr(settings, "GPUSWEEP_EVIDENCE_DIGEST_BUCKET", "") or "")
        if not self.bucket:
            raise ImproperlyConfigured("GPUSWEEP_EVIDENCE_DIGEST_STORE names campaigns.digests.ObjectLockStore but "
                                       "GPUSWEEP_EVIDENCE_DIGEST_BUCKET is not set: the S3 bucket (with Object Lock "
                                       "enabled) that keeps the evidence digests")
        self.endpoint_url = str(getattr(settings, "GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL", "") or "")
        self.prefix = str(getattr(settings, "GPUSWEEP_EVIDENCE_DIGEST_PREFIX", "") or "")
        self.days = int(getattr(settings, "GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS", 2557))
        self.mode = str(getattr(settings, "GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE", "COMPLIANCE")).upper()
        if self.mode not in self.MODES:
            raise ImproperlyConfigured(f"GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE={self.mode!r}: "
                                       f"one of {', '.join(self.MODES)}")
        if self.days < 1:
            raise ImproperlyConfigured(f"GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS={self.days} must be at least 1")

    def folder(self, campaign_id: int) -> str:
        return f"{self.prefix}campaign-{int(campaign_id)}/"

    def key(self, campaign_id: int, n: int) -> str:
        return f"{self.folder(campaign_id)}{int(n):08d}.json"

    @property
    def client(self) -> Any:
        with _S3_LOCK:
            if self.endpoint_url not in _S3_CLIENTS:
                import boto3  # only where this store is configured: the folder store needs no boto3
                from botocore.config import Config

                # A session of its own: boto3's default session is not thread-safe; a client is.
                _S3_CLIENTS[self.endpoint_url] = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint_url or None, config=Config(retries={"mode": "standard"}))
            return _S3_CLIENTS[self.endpoint_url]

    def check_bucket(self) -> None:
        """ImproperlyConfigured unless the bucket exists, can be read and has Object Lock enabled."""
        if (self.endpoint_url, self.bucket) in _S3_LOCKED_BUCKETS:
            return
        from botocore.exceptions import ClientError

        no_lock = (f"GPUSWEEP_EVIDENCE_DIGEST_BUCKET={self.bucket!r} has no Object Lock: evidence digests need a "
                   "bucket created with Object Lock enabled, so that what is written cannot be deleted or overwritten")
        try:
            answer = self.client.get_object_lock_configuration(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code == "ObjectLockConfigurationNotFoundError":
                raise ImproperlyConfigured(no_lock) from None
            raise ImproperlyConfigured(f"GPUSWEEP_EVIDENCE_DIGEST_BUCKET={self.bucket!r}: cannot read its Object Lock "
                                       f"configuration: {exc}") from exc
        if answer.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") != "Enabled":
            raise ImproperlyConfigured(no_lock)
        with _S3_LOCK:
            _S3_LOCKED_BUCKETS.add((self.endpoint_url, self.bucket))

    def read(self, campaign_id: int) -> list[dict[str, Any]]:
        self.check_bucket()
        folder = self.folder(campaign_id)
        entry_key = re.compile(re.escape(folder) + r"(\d+)\.json")
        first: dict[str, str] = {}
        pages = self.client.get_paginator("list_object_versions").paginate(Bucket=self.bucket, Prefix=folder)
        for page in pages:
            for version in page.get("Versions", []):
                # S3 lists a key's versions newest first: the last one seen is the one written first.
                first[version["Key"]] = version["VersionId"]
        numbered = sorted((int(m.group(1)), key) for key in first if (m := entry_key.fullmatch(key)))
        return [json.loads(self._text(key, first[key])) for _, key in numbered]

    def _text(self, key: str, version_id: str) -> str:
        cached = (self.endpoint_url, self.bucket, key, version_id)
        text = _S3_READ.get(cached)
        if text is None:
            answer = self.client.get_object(Bucket=self.bucket, Key=key, VersionId=version_id)
            text = answer["Body"].read().decode("utf-8")
            with _S3_LOCK:
                if len(_S3_READ) >= _S3_READ_MAX:
                    _S3_READ.clear()
                _S3_READ[cached] = text
        return text

    def append(self, campaign_id: int, kind: str, record: dict[str, Any], signature: str, key_id: str) -> None:
        from botocore.exceptions import ClientError

        for _ in range(self.ATTEMPTS):
            entry = next_entry(self.read(campaign_id), campaign_id, kind, record, signature, key_id)
            body = line_of(entry)
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=self.key(campaign_id, entry["n"]), Body=body,
                    ContentType="application/json", IfNoneMatch="*", ObjectLockMode=self.mode,
                    ObjectLockRetainUntilDate=datetime.now(UTC) + timedelta(days=self.days),
                    ChecksumAlgorithm="SHA256", ChecksumSHA256=base64.b64encode(hashlib.sha256(body).digest()).decode())
                return
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code not in ("PreconditionFailed", "ConditionalRequestConflict"):
                    raise
        raise DigestConflict(f"campaign {campaign_id}: digest {kind} not stored in s3://{self.bucket}/"
                             f"{self.folder(campaign_id)}: another writer took the next number {self.ATTEMPTS} times")


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
    # Entries found intact by an earlier check in this process are not hashed again while the store
    # hands back those very objects (FolderStore.read does while its file is only appended to).
    intact = 0
    for seen, entry in zip(_CHECKED.get(campaign_id, ()), digests, strict=False):
        if seen is not entry:
            break
        intact += 1
    if problems := verify.digest_problems(digests, intact):
        raise DigestMismatch(f"campaign {campaign_id}: {problems[0]}")
    with _FOLDER_LOCK:
        if len(_CHECKED) >= _FOLDER_READ_MAX:
            _CHECKED.clear()
        _CHECKED[campaign_id] = tuple(digests)
    latest_seal = next((d for d in reversed(digests) if d["kind"] == "seal"), None)
    for entry in {id(d): d for d in (digests[-1], latest_seal) if d is not None}.values():
        for chain, seq, head in verify.pinned_heads(entry):
            if head_at(chain, seq) != head:
                name = "its campaign chain" if chain is None else f"node sweep {chain}"
                raise DigestMismatch(f"campaign {campaign_id}: {name} no longer has the head signed at #{seq} "
                                     f"(digest #{entry['n']}): refusing to sign")
