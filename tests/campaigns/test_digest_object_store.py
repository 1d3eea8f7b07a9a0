"""Issue 28 item 2: the evidence digest store in an object store with retention (S3 Object Lock).

No S3 is reachable from here or from CI, so moto's S3-compatible HTTP server (``ThreadedMotoServer``
on a free 127.0.0.1 port) stands in for it: the service talks to it through boto3 over HTTP exactly
as it would to S3, with made-up credentials in the AWS_* variables boto3 reads. What moto enforces
and what it does not is said where a test relies on it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from django.core.exceptions import ImproperlyConfigured
from moto.server import ThreadedMotoServer

from campaigns import digests, evidence, verify
from campaigns.models import Campaign, EvidenceSeal
from tests.campaigns.fleet import completed_campaign, drive
from tests.campaigns.test_digests import _launder, _offline
from tests.helpers import REPO

pytestmark = pytest.mark.django_db
PREFIX = "gpusweep/"
DAYS = 30


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch) -> Any:
    """boto3's own credential chain, fed made-up keys; nothing from this machine's AWS configuration."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint)


def _bucket(s3: Any, *, locked: bool = True) -> str:
    name = f"digests-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name, **({"ObjectLockEnabledForBucket": True} if locked else {}))
    return name


@pytest.fixture
def bucket(s3, s3_endpoint, settings) -> str:
    """A bucket created with Object Lock, and the service pointed at it."""
    name = _bucket(s3)
    settings.GPUSWEEP_EVIDENCE_DIGEST_STORE = "campaigns.digests.ObjectLockStore"
    settings.GPUSWEEP_EVIDENCE_DIGEST_BUCKET = name
    settings.GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL = s3_endpoint
    settings.GPUSWEEP_EVIDENCE_DIGEST_PREFIX = PREFIX
    settings.GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS = DAYS
    settings.GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE = "COMPLIANCE"
    return name


@pytest.fixture
def completed(bucket, django_capture_on_commit_callbacks) -> Campaign:  # type: ignore[no-untyped-def]
    return completed_campaign(django_capture_on_commit_callbacks)


def _versions(s3: Any, bucket: str, campaign_id: int) -> list[dict[str, Any]]:
    return s3.list_object_versions(Bucket=bucket, Prefix=f"{PREFIX}campaign-{campaign_id}/").get("Versions", [])


def _fetched_digest_file(s3: Any, bucket: str, campaign_id: int, tmp_path) -> Any:
    """What an auditor does: fetch the campaign's objects from the bucket and put them in one file, in order."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}campaign-{campaign_id}/")["Contents"]
    path = tmp_path / f"campaign-{campaign_id}.jsonl"
    path.write_bytes(b"".join(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                              for o in sorted(listed, key=lambda o: o["Key"])))
    return path


def test_an_honest_campaign_lands_in_the_bucket_chained_and_locked(completed, bucket, s3):
    assert isinstance(digests.store(), digests.ObjectLockStore)
    recorded = digests.store().read(completed.pk)
    kinds = [d["kind"] for d in recorded]
    assert kinds.count("node_head") == 2 and kinds[-1] == "seal" and not verify.digest_problems(recorded)
    keys = sorted(v["Key"] for v in _versions(s3, bucket, completed.pk))
    assert keys == [f"{PREFIX}campaign-{completed.pk}/{n:08d}.json" for n in range(1, len(recorded) + 1)]
    for entry, key in zip(recorded, keys, strict=True):
        assert entry["prev"] == (recorded[entry["n"] - 2]["digest"] if entry["n"] > 1 else "")
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        assert head["ObjectLockMode"] == "COMPLIANCE"
        ahead = head["ObjectLockRetainUntilDate"] - datetime.now(UTC)
        assert timedelta(days=DAYS - 1) < ahead <= timedelta(days=DAYS), ahead
        assert head["ChecksumSHA256"]  # S3 takes an upload with a retention only with a checksum
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == digests.line_of(entry)  # the folder store's line, one object each
    assert evidence.verify_campaign(completed) == []


def test_an_entry_cannot_be_deleted_overwritten_or_hidden(completed, bucket, s3):
    """moto enforces what S3 does for these: a locked version cannot be deleted (AccessDenied, with or
    without s3:BypassGovernanceRetention in COMPLIANCE mode) and ``If-None-Match: *`` refuses a write over
    an existing key (412). A PUT without it makes a new version and a DELETE without a version id a
    delete marker, as in S3; the store reads the first version of each key, so neither changes what it
    reads. (moto does not refuse shortening a COMPLIANCE retention, which S3 does: not tested here.)"""
    before = digests.store().read(completed.pk)
    first = {v["Key"]: v["VersionId"] for v in _versions(s3, bucket, completed.pk)}
    key, version = sorted(first.items())[0]
    with pytest.raises(ClientError) as refused:
        s3.delete_object(Bucket=bucket, Key=key, VersionId=version)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError) as refused:
        s3.delete_object(Bucket=bucket, Key=key, VersionId=version, BypassGovernanceRetention=True)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key=key, Body=b"{}", IfNoneMatch="*", ChecksumAlgorithm="SHA256")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    forged = dict(before[0], record=dict(before[0]["record"], head="0" * 64))
    s3.put_object(Bucket=bucket, Key=key, Body=digests.line_of(forged))  # a new version over it
    s3.delete_object(Bucket=bucket, Key=sorted(first)[-1])  # a delete marker over the seal
    assert s3.get_object(Bucket=bucket, Key=key, VersionId=version)["Body"].read() == digests.line_of(before[0])
    assert digests.store().read(completed.pk) == before
    assert evidence.verify_campaign(completed) == []


def test_the_laundering_sequence_is_refused_and_named_against_the_object_store(
        completed, bucket, s3, tmp_path, django_capture_on_commit_callbacks):
    _launder(completed)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(digests.DigestMismatch, match="refusing"):
        drive(completed.pk)  # the redrive: the engine finishes the step, then the signer refuses
    assert not EvidenceSeal.objects.filter(campaign=completed).exists()  # nothing re-sealed
    problems = evidence.verify_campaign(Campaign.objects.get(pk=completed.pk))
    assert any("digest" in p and "no longer has the head" in p for p in problems), problems
    # The auditor's way: the objects fetched from the bucket, checked offline against the export.
    result = _offline(tmp_path, evidence.export_for_reading(completed.pk),
                      _fetched_digest_file(s3, bucket, completed.pk, tmp_path))
    assert result.returncode == 1 and "no longer has the head" in result.stdout, result.stdout


def test_two_writers_that_took_the_same_number_make_one_chain(bucket, monkeypatch):
    ours, theirs = digests.ObjectLockStore(), digests.ObjectLockStore()
    reads: list[int] = []

    def stale_then_fresh(campaign_id: int) -> list[dict[str, Any]]:
        reads.append(campaign_id)
        if len(reads) == 1:  # we read the empty chain, then they write #1 before we do
            theirs.append(campaign_id, "seal", {"by": "them"}, "sig-them", "key")
            return []
        return theirs.read(campaign_id)

    monkeypatch.setattr(ours, "read", stale_then_fresh)
    ours.append(7, "seal", {"by": "us"}, "sig-us", "key")  # #1 refused (412): read again, written as #2
    chain = theirs.read(7)
    assert [(d["n"], d["record"]["by"]) for d in chain] == [(1, "them"), (2, "us")] and len(reads) == 2
    assert not verify.digest_problems(chain)

    monkeypatch.setattr(ours, "read", lambda campaign_id: [])  # always behind: a bounded number of tries
    with pytest.raises(digests.DigestConflict, match="another writer"):
        ours.append(7, "seal", {"by": "us"}, "sig-us", "key")
    assert len(theirs.read(7)) == 2


def test_governance_mode_by_configuration(bucket, s3, settings):
    """GOVERNANCE: still refused to a plain delete; moto, like S3, lets a bypass delete a version."""
    settings.GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE = "GOVERNANCE"
    settings.GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS = 1
    digests.store().append(3, "seal", {"n": 1}, "sig", "key")
    [version] = _versions(s3, bucket, 3)
    head = s3.head_object(Bucket=bucket, Key=version["Key"])
    assert head["ObjectLockMode"] == "GOVERNANCE"
    assert timedelta(hours=23) < head["ObjectLockRetainUntilDate"] - datetime.now(UTC) <= timedelta(days=1)
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.delete_object(Bucket=bucket, Key=version["Key"], VersionId=version["VersionId"])


def test_a_missing_bucket_setting_or_a_bucket_without_object_lock_is_a_clear_error(bucket, s3, settings):
    settings.GPUSWEEP_EVIDENCE_DIGEST_BUCKET = ""
    with pytest.raises(ImproperlyConfigured, match="GPUSWEEP_EVIDENCE_DIGEST_BUCKET is not set"):
        digests.store()
    settings.GPUSWEEP_EVIDENCE_DIGEST_BUCKET = _bucket(s3, locked=False)
    with pytest.raises(ImproperlyConfigured, match="has no Object Lock"):
        digests.store().read(1)
    with pytest.raises(ImproperlyConfigured, match="has no Object Lock"):  # nothing written unlocked
        digests.store().append(1, "seal", {"n": 1}, "sig", "key")
    assert "Contents" not in s3.list_objects_v2(Bucket=settings.GPUSWEEP_EVIDENCE_DIGEST_BUCKET)
    settings.GPUSWEEP_EVIDENCE_DIGEST_BUCKET = f"absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ImproperlyConfigured, match="NoSuchBucket"):
        digests.store().read(1)
    settings.GPUSWEEP_EVIDENCE_DIGEST_BUCKET = bucket
    settings.GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE = "LEGAL"
    with pytest.raises(ImproperlyConfigured, match="COMPLIANCE, GOVERNANCE"):
        digests.store()


@pytest.mark.parametrize(("name", "value", "says"), [
    ("GPUSWEEP_EVIDENCE_DIGEST_RETENTION_MODE", "legal-hold", "COMPLIANCE or GOVERNANCE"),
    ("GPUSWEEP_EVIDENCE_DIGEST_RETENTION_DAYS", "0", "must be at least 1"),
    ("GPUSWEEP_EVIDENCE_DIGEST_ENDPOINT_URL", "minio:9000", "an http:// or https:// URL"),
])
def test_the_settings_refuse_a_bad_value_at_start(name, value, says):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpusweep.settings", name: value}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and name in result.stderr and says in result.stderr, result.stderr[-2000:]
