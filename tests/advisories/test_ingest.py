"""Ingesting documents into the database: new, unchanged, newer revision, integrity, bad input."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from advisories.csaf import DocumentError
from advisories.ingest import FetchedDocument, ingest_document, ingest_documents
from advisories.models import CVE, Advisory, AdvisoryEvent, AffectedRange, ReviewItem
from advisories.sources import FolderSource, resolve
from tests.advisories.conftest import FIXTURES, bulletins

pytestmark = pytest.mark.django_db


def _counts() -> tuple[int, int, int, int]:
    return (Advisory.objects.count(), CVE.objects.count(), AffectedRange.objects.count(),
            AffectedRange.cves.through.objects.count())


def test_it_ingests_the_bundled_documents_and_records_integrity():
    summary = ingest_documents(FolderSource(str(FIXTURES)).items())
    assert (summary.new, summary.updated, summary.unchanged, summary.errors) == (6, 0, 0, [])
    assert summary.integrity == {"match": 5, "mismatch": 1}
    # 5670's vGPU row with two labels run together is decoded now; what is left is listed.
    assert summary.review == ReviewItem.objects.filter(state="open").count() == 11
    a5703 = Advisory.objects.get(publisher="NVIDIA", publisher_id="5703")
    assert a5703.integrity == "mismatch"
    assert a5703.published_sha256 == (FIXTURES / "5703.json.sha256").read_text().split()[0]
    assert a5703.content_sha256 == hashlib.sha256((FIXTURES / "5703.json").read_bytes()).hexdigest()
    assert AdvisoryEvent.objects.filter(advisory=a5703, kind="integrity_mismatch").count() == 1
    tesla = a5703.ranges.filter(component="driver", os_family="linux", product_line="tesla", basis="decoded")
    assert {(r.branch, r.fixed_version) for r in tesla} == {
        ("R580", "580.95.05"), ("R570", "570.195.03"), ("R535", "535.274.02")}
    assert tesla.get(branch="R580").cves.count() == 6
    assert a5703.cves.count() == 9
    a5670 = Advisory.objects.get(publisher_id="5670")
    guest = a5670.ranges.filter(product_id__startswith="windowsr535_vgpu_16_guest_driver_539_28")
    assert set(guest.values_list("upper_version", "upper_inclusive", "basis")) == {("539.28", True, "decoded")}
    assert sorted(a5670.review_items.values_list("kind", flat=True)) == ["unparsed_row", "unsupported_branch"]
    assert not Advisory.objects.get(publisher_id="5557").ranges.filter(os_family="linux").exists()


def test_re_ingesting_unchanged_documents_writes_nothing():
    ingest_documents(FolderSource(str(FIXTURES)).items())
    before = _counts()
    stamps = list(Advisory.objects.order_by("id").values_list("updated_at", flat=True))
    with CaptureQueriesContext(connection) as queries:
        summary = ingest_documents(FolderSource(str(FIXTURES)).items())
    assert (summary.new, summary.updated, summary.unchanged) == (0, 0, 6)
    writes = [q["sql"] for q in queries if q["sql"].split()[0].upper() in {"INSERT", "UPDATE", "DELETE"}]
    assert writes == []
    assert _counts() == before
    assert list(Advisory.objects.order_by("id").values_list("updated_at", flat=True)) == stamps


def test_a_newer_revision_updates_in_place_and_keeps_history(tmp_path: Path):
    ingest_document(FetchedDocument("5582.json", (FIXTURES / "5582.json").read_bytes(), "file"))
    data = json.loads((FIXTURES / "5582.json").read_bytes())
    tracking = data["document"]["tracking"]
    tracking["version"] = "2.0.0"
    tracking["revision_history"].append({"date": "2024-10-01T00:00:00Z", "number": "2.0.0",
                                         "summary": "Fixed version for GPU Operator corrected"})
    operator = next(b for b in data["product_tree"]["branches"][0]["branches"] if b["category"] == "architecture")
    fixed = operator["branches"][3]["product"]
    assert fixed["product_id"] == "linux_nvidia_gpu_operator_v24_6_2"
    first = Advisory.objects.get(publisher_id="5582")
    outcome, advisory_id, _, _ = ingest_document(FetchedDocument("5582-v2.json", json.dumps(data).encode(), "file"))
    assert outcome == "updated" and advisory_id == first.id
    advisory = Advisory.objects.get(publisher_id="5582")
    assert Advisory.objects.filter(publisher_id="5582").count() == 1
    assert advisory.tracking_version == "2.0.0"
    assert [h["number"] for h in advisory.revision_history] == ["1.0.0", "2.0.0"]
    assert advisory.history[0]["tracking_version"] == "1.0.0"
    assert advisory.history[0]["content_sha256"] == first.content_sha256
    # An older revision arriving late changes nothing.
    outcome, _, _, _ = ingest_document(FetchedDocument("5582.json", (FIXTURES / "5582.json").read_bytes(), "file"))
    assert outcome == "unchanged"
    assert Advisory.objects.get(publisher_id="5582").tracking_version == "2.0.0"


@pytest.mark.parametrize(("content", "problem"), [
    (b'{"document": {"csaf_version": "2.0", "title": "x"', "invalid JSON"),
    (b'{"document": {"csaf_version": "2.0"}}', "document.title is missing"),
    (b"<html><body>Not here</body></html>", "invalid JSON"),
    (b"[1, 2]", "top level should be an object"),
])
def test_a_bad_document_is_reported_by_name_and_changes_nothing(content, problem):
    ingest_documents(FolderSource(str(FIXTURES)).items())
    before = _counts()
    summary = ingest_documents([FetchedDocument("https://example.test/bad.json", content, "url")])
    assert len(summary.errors) == 1
    assert summary.errors[0].startswith("https://example.test/bad.json: ") and problem in summary.errors[0]
    assert _counts() == before
    assert AdvisoryEvent.objects.filter(kind="rejected", document="https://example.test/bad.json").exists()


def test_a_folder_with_one_bad_document_still_ingests_the_others(tmp_path: Path):
    shutil.copy(FIXTURES / "5582.json", tmp_path / "5582.json")
    (tmp_path / "9999.json").write_text('{"document": ')
    summary = ingest_documents(resolve(str(tmp_path)).items())
    assert summary.new == 1 and summary.integrity == {"absent": 1}
    assert summary.errors == [f"{tmp_path / '9999.json'}: invalid JSON at line 1 column 14: Expecting value"]


def test_it_refuses_an_unknown_source_clearly():
    with pytest.raises(DocumentError, match="no such file, folder, URL or configured source"):
        resolve("/nonexistent/advisories")


def test_every_document_of_the_shared_corpus_ingests_and_re_ingests_unchanged(shared_csaf):
    summary = ingest_documents(FolderSource(str(shared_csaf)).items())
    documents = bulletins(shared_csaf)
    assert summary.errors == []
    assert all(summary.outcomes[str(p)][0].startswith("new") for p in documents)
    assert summary.integrity["mismatch"] >= 1
    assert Advisory.objects.get(publisher_id="5703").integrity == "mismatch"
    # The CVE index is read: bulletins with no CSAF here are known, ranges unknown, products to review.
    index_only = Advisory.objects.filter(ranges_unknown=True)
    assert index_only.count() == summary.new - len(documents) > 0
    assert not ReviewItem.objects.filter(advisory__in=index_only).exclude(kind="index_only").exists()
    again = ingest_documents(FolderSource(str(shared_csaf)).items())
    assert (again.new, again.updated) == (0, 0)
    assert all(again.outcomes[str(p)][0].startswith("unchanged") for p in documents)
