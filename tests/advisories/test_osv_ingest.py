"""OSV records and Livepatch notices ingested beside CSAF: a folder, a URL, a zip bundle; bad
records rejected alone; a modified record updates in place; the same record twice is unchanged."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest
from django.conf import settings

from advisories.ingest import ingest_documents
from advisories.models import CVE, Advisory, AdvisoryEvent, AffectedRange
from advisories.osv import OS_LIVEPATCH, OS_PACKAGE
from advisories.sources import BundleSource, FolderSource, resolve
from conftest import need
from tests.advisories.conftest import FIXTURES

pytestmark = pytest.mark.django_db

OSV = FIXTURES.parent / "osv"
SHARED_OSV = Path(settings.GPUSWEEP_SHARED_DATA_DIR) / "osv-ubuntu"


def record(name: str) -> dict:
    return json.loads((OSV / name).read_text())


def write(folder: Path, name: str, data: dict) -> Path:
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def test_every_shared_sample_ingests():
    need(SHARED_OSV.is_dir(), f"needs the OSV samples at {SHARED_OSV}")
    summary = ingest_documents(FolderSource(str(SHARED_OSV)).items())
    assert summary.errors == []
    assert summary.new == 8  # six USNs, two LSNs; the README is skipped
    assert set(Advisory.objects.values_list("publisher", flat=True)) == {"Ubuntu"}
    assert AffectedRange.objects.filter(component=OS_LIVEPATCH).exists()


def test_a_kernel_usn_becomes_source_package_ranges_with_binaries_and_severity():
    summary = ingest_documents(resolve(str(OSV / "USN-7328-2.json")).items())
    assert (summary.new, summary.errors) == (1, [])
    advisory = Advisory.objects.get(publisher="Ubuntu", publisher_id="USN-7328-2")
    assert advisory.tracking_version == "2026-04-27T14:11:40Z"
    # CVE-2024-56672: CVSS 7.8 (high) and Ubuntu's "high"; CVE-2025-0927: Ubuntu's "medium" only.
    assert dict(advisory.cves.values_list("cve_id", "severity")) == {"CVE-2024-56672": "high",
                                                                   "CVE-2025-0927": "medium"}
    assert advisory.severity == "high"
    rng = advisory.ranges.get()
    assert (rng.component, rng.product_id, rng.fixed_version) == (OS_PACKAGE, "Ubuntu:22.04:LTS/linux-nvidia",
                                                                  "5.15.0-1073.74")
    assert rng.scope["kernel"] == "1" and rng.scope["ecosystem"] == "Ubuntu:22.04:LTS"
    assert "linux-modules-5.15.0-1073-nvidia" in rng.condition["binaries"]
    assert rng.severity == "high"


def test_a_livepatch_notice_names_kernels_flavours_and_livepatch_versions():
    ingest_documents(resolve(str(OSV / "LSN-0066-1.json")).items())
    rows = {r.product_id: r for r in AffectedRange.objects.filter(advisory__publisher_id="LSN-0066-1")}
    generic = rows["bionic/generic-4.15"]
    assert (generic.scope["kernel"], generic.scope["livepatch_version"]) == ("4.15.0-69", "66")
    assert set(generic.cves.values_list("cve_id", flat=True)) == {"CVE-2020-8647", "CVE-2020-8648", "CVE-2020-8649"}


def test_the_same_record_twice_is_unchanged_and_a_modified_one_updates_in_place(tmp_path):
    data = record("USN-7328-2.json")
    write(tmp_path, "USN-7328-2.json", data)
    assert ingest_documents(FolderSource(str(tmp_path)).items()).new == 1
    again = ingest_documents(FolderSource(str(tmp_path)).items())
    assert (again.new, again.updated, again.unchanged) == (0, 0, 1)
    first = Advisory.objects.get(publisher_id="USN-7328-2")
    range_id = first.ranges.get().id
    data["modified"] = "2026-05-01T00:00:00Z"
    data["affected"][0]["ranges"][0]["events"][1]["fixed"] = "5.15.0-1074.75"
    write(tmp_path, "USN-7328-2.json", data)
    assert ingest_documents(FolderSource(str(tmp_path)).items()).updated == 1
    advisory = Advisory.objects.get(publisher_id="USN-7328-2")
    assert advisory.id == first.id and advisory.ranges.get().id == range_id  # in place, history kept
    assert advisory.ranges.get().fixed_version == "5.15.0-1074.75"
    assert advisory.history[-1]["tracking_version"] == "2026-04-27T14:11:40Z"
    # An older copy of the record changes nothing.
    data["modified"] = "2025-01-01T00:00:00Z"
    write(tmp_path, "USN-7328-2.json", data)
    assert ingest_documents(FolderSource(str(tmp_path)).items()).unchanged == 1


@pytest.mark.parametrize(("change", "problem"), [
    (lambda d: d.pop("modified"), "modified should be non-empty text"),
    (lambda d: d.update(schema_version="2.0.0"), "schema_version '2.0.0' is not supported"),
    (lambda d: d.update(modified="yesterday"), "not an RFC 3339 time"),
    (lambda d: d["affected"][0]["ranges"][0]["events"].append({"fixed": "not a version"}), "is not a dpkg version"),
    (lambda d: d["affected"][0]["ranges"][0]["events"].append({"fixed": "1", "introduced": "0"}), "exactly one"),
    (lambda d: d["affected"][0].update(package={"ecosystem": "Ubuntu:22.04:LTS"}), "package.name"),
    (lambda d: d["affected"][0].update(ecosystem_specific={"binaries": [{"binary_version": "1"}]}), "names no binary"),
])
def test_a_malformed_record_is_rejected_with_its_problem_and_changes_nothing(tmp_path, change, problem):
    data = record("USN-7328-2.json")
    change(data)
    write(tmp_path, "bad.json", data)
    good = record("USN-5547-1.json")
    write(tmp_path, "good.json", good)
    summary = ingest_documents(FolderSource(str(tmp_path)).items())
    assert summary.new == 1 and len(summary.errors) == 1
    assert problem in summary.errors[0] and "bad.json" in summary.errors[0]
    assert not Advisory.objects.filter(publisher_id="USN-7328-2").exists()
    assert AdvisoryEvent.objects.filter(kind="rejected", document__endswith="bad.json").exists()


def test_a_zip_bundle_is_read_member_by_member(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("USN-7328-2.json", (OSV / "USN-7328-2.json").read_bytes())
        archive.writestr("LSN-0066-1.json", (OSV / "LSN-0066-1.json").read_bytes())
        archive.writestr("broken.json", b"{not json")
        archive.writestr("notes.txt", b"hello")
    bundle = tmp_path / "all.zip"
    bundle.write_bytes(buffer.getvalue())
    summary = ingest_documents(resolve(str(bundle)).items())
    assert summary.new == 2 and len(summary.errors) == 1 and "all.zip!broken.json" in summary.errors[0]
    assert "invalid JSON" in summary.errors[0]
    assert Advisory.objects.get(publisher_id="USN-7328-2").source_kind == "bundle"
    bundle.write_bytes(b"not a zip")
    assert "not a zip bundle" in ingest_documents(BundleSource(str(bundle)).items()).errors[0]


def test_a_bundle_url_is_fetched_conditionally(http_server, tmp_path):
    base, handler = http_server
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("USN-7328-2.json", (OSV / "USN-7328-2.json").read_bytes())
    handler.routes["/Ubuntu/all.zip"] = (200, "application/zip", buffer.getvalue())
    url = f"{base}/Ubuntu/all.zip"
    assert ingest_documents(resolve(url).items()).new == 1
    again = ingest_documents(resolve(url).items())
    assert (again.new, again.unchanged) == (0, 1)


def test_a_record_from_a_url(http_server):
    base, handler = http_server
    handler.routes["/osv/USN-7328-2.json"] = (200, "application/json", (OSV / "USN-7328-2.json").read_bytes())
    assert ingest_documents(resolve(f"{base}/osv/USN-7328-2.json").items()).new == 1


def test_a_distribution_record_does_not_overwrite_the_vendors_cve():
    CVE.objects.create(cve_id="CVE-2022-31607", description="NVIDIA's words", severity="critical",
                       cvss_vector="CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:C/C:H/I:H/A:H")
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    cve = CVE.objects.get(cve_id="CVE-2022-31607")
    assert (cve.description, cve.severity) == ("NVIDIA's words", "critical")
    assert CVE.objects.get(cve_id="CVE-2022-31608").severity == "high"  # worst of CVSS high and Ubuntu low
