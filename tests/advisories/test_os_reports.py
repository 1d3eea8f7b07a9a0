"""VEX and reports with distribution advisories (issue 30): Ubuntu's USN for a packaged NVIDIA driver
beside NVIDIA's bulletin, one node still exposed and one fixed by the package update."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from advisories.ingest import ingest_documents
from advisories.models import Advisory
from advisories.sources import resolve
from advisories.vex import vex_document
from inventory.choices import ClusterKind
from inventory.models import Cluster
from tests.advisories.conftest import add_node
from tests.advisories.test_osmatch import DRIVER_FIXED, DRIVER_OLD, driver_packages, kernel_packages, report
from tests.advisories.test_osv_ingest import OSV
from tests.advisories.test_vex import failed_mandatory_tests, schema_errors, statuses

pytestmark = pytest.mark.django_db
PACKAGE = "nvidia-graphics-drivers-515-server"


@pytest.fixture
def fleet() -> Client:
    cluster = Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)
    for name in ("gpu01", "gpu02"):
        report(add_node(cluster, name, driver="515.48.07"), driver_packages(DRIVER_OLD))
    runfile = add_node(cluster, "gpu03", driver="515.48.07")  # NVIDIA's runfile: no package
    report(runfile, [])
    ingest_documents(resolve(str(OSV / "nvidia-5383.json")).items())
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    report(cluster.nodes.get(name="gpu02"), driver_packages(DRIVER_FIXED), reference="campaign 3, sweep 7")
    user = User.objects.create_user("viewer-user", password="pw-long-enough-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


def test_a_usns_vex_is_valid_csaf_naming_each_node_package_with_its_status(fleet):
    document = vex_document(Advisory.objects.filter(publisher_id="USN-5547-1"))
    assert schema_errors(document) == []
    assert failed_mandatory_tests(document) == []
    assert failed_mandatory_tests(document, "recommended") == []
    status = {k: [p for p in v if p.endswith(PACKAGE)] for k, v in statuses(document, "CVE-2022-31607").items()}
    assert status == {"known_affected": [f"dgx/gpu01/{PACKAGE}"], "fixed": [f"dgx/gpu02/{PACKAGE}"],
                      "known_not_affected": [f"dgx/gpu03/{PACKAGE}"]}
    [vuln] = [v for v in document["vulnerabilities"] if v["cve"] == "CVE-2022-31607"]
    assert vuln["remediations"] == [
        {
            "category": "vendor_fix",
            "details": f"update {PACKAGE} to {DRIVER_FIXED}",
            "product_ids": [f"dgx/gpu01/{PACKAGE}"],
        }
    ]
    assert "https://osv.dev/vulnerability/USN-5547-1" in {r["url"] for r in document["document"]["references"]}


def _justified(document: dict, cve: str) -> dict[str, str]:
    """product -> the flag (VEX justification) the document gives it for `cve`."""
    [vuln] = [v for v in document["vulnerabilities"] if v["cve"] == cve]
    return {pid: flag["label"] for flag in vuln.get("flags", []) for pid in flag["product_ids"]}


def test_a_usns_vex_says_not_affected_from_the_package_sets_with_the_reason(fleet, tmp_path):
    """gpu03 runs NVIDIA's runfile: its package set holds no binary of the source package, so the USN
    does not affect it (component_not_present); the jammy nodes have none of the USN's other jammy
    sources either. A node on a release the USN has no range for, and one with no package set, get no
    statement: the USN says nothing of them."""
    cluster = Cluster.objects.get(name="dgx")
    report(add_node(cluster, "noble", driver="515.48.07"), driver_packages(DRIVER_OLD),
           release={"ID": "ubuntu", "VERSION_ID": "24.04", "VERSION": "24.04 LTS"})
    add_node(cluster, "unreported", driver="515.48.07")
    document = vex_document(Advisory.objects.filter(publisher_id="USN-5547-1"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    assert failed_mandatory_tests(document, "recommended") == []
    flags = _justified(document, "CVE-2022-31607")
    assert flags[f"dgx/gpu03/{PACKAGE}"] == "component_not_present"
    assert flags["dgx/gpu01/nvidia-graphics-drivers-470"] == "component_not_present"
    assert f"dgx/gpu01/{PACKAGE}" not in flags and f"dgx/gpu02/{PACKAGE}" not in flags  # exposures speak
    assert not [p for p in statuses(document, "CVE-2022-31607").values() for p in p
                if p.startswith(("dgx/noble/", "dgx/unreported/"))]
    [vuln] = [v for v in document["vulnerabilities"] if v["cve"] == "CVE-2022-31607"]
    threats = {pid: t["details"] for t in vuln["threats"] for pid in t["product_ids"]}
    assert threats[f"dgx/gpu03/{PACKAGE}"] == f"no package built from {PACKAGE} is installed"


def test_a_package_outside_the_range_is_not_affected_as_vulnerable_code_not_present(tmp_path):
    """The package is installed, at a version the range does not hold (a later upload than the fix)."""
    cluster = Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)
    later = "515.86.01-0ubuntu0.22.04.1"
    report(add_node(cluster, "gpu01", driver="515.86.01"), driver_packages(later))
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    document = vex_document(Advisory.objects.filter(publisher_id="USN-5547-1"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    assert _justified(document, "CVE-2022-31607")[f"dgx/gpu01/{PACKAGE}"] == "vulnerable_code_not_present"
    [vuln] = [v for v in document["vulnerabilities"] if v["cve"] == "CVE-2022-31607"]
    threats = {pid: t["details"] for t in vuln["threats"] for pid in t["product_ids"]}
    outside = f"{PACKAGE} {later} is outside the affected range (fixed in {DRIVER_FIXED})"
    assert threats[f"dgx/gpu01/{PACKAGE}"] == outside
    product = next(p for p in document["product_tree"]["full_product_names"] if p["product_id"].endswith(PACKAGE))
    assert product["name"] == f"dgx/gpu01/{PACKAGE} {later}"


def test_nvidias_vex_over_the_same_nodes_says_what_the_finding_says(fleet):
    document = vex_document(Advisory.objects.filter(publisher_id="5383"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    status = statuses(document, "CVE-2022-31607")
    # gpu02's package is fixed, NVIDIA's upstream range still holds its 515.48.07: the distribution decides.
    assert status["fixed"] == ["dgx/gpu02/driver"]
    assert status["known_affected"] == ["dgx/gpu01/driver", "dgx/gpu03/driver"]
    [vuln] = [v for v in document["vulnerabilities"] if v["cve"] == "CVE-2022-31607"]
    fixes = {r["details"]: r["product_ids"] for r in vuln["remediations"]}
    assert fixes == {
        f"update {PACKAGE} to {DRIVER_FIXED}": ["dgx/gpu01/driver"],
        "update to 515.65.01": ["dgx/gpu03/driver"],
    }


def test_the_api_vex_of_a_usn(fleet):
    document = fleet.get("/api/v1/advisories/advisories/ubuntu-usn-5547-1/vex/").json()
    assert statuses(document, "CVE-2022-31607")["fixed"] == [f"dgx/gpu02/{PACKAGE}"]


def test_the_advisory_report_of_a_usn_names_the_package_and_who_fixed_it(fleet):
    data = fleet.get("/advisories/ubuntu-usn-5547-1/report.json").json()
    rows = {r["node"]: r for r in data["exposures"]}
    assert set(rows) == {"gpu01", "gpu02"}
    assert rows["gpu01"]["component"] == f"package {PACKAGE}" and rows["gpu01"]["state"] == "open"
    assert rows["gpu01"]["fixed_version"] == DRIVER_FIXED and rows["gpu01"]["detected_version"] == DRIVER_OLD
    assert (rows["gpu02"]["state"], rows["gpu02"]["remediated_by"]) == ("remediated", "campaign 3, sweep 7")
    assert data["counts"] == {"open": 1, "remediated": 1}
    table = list(csv.reader(io.StringIO(fleet.get("/advisories/ubuntu-usn-5547-1/report.csv").content.decode())))
    assert any(row[:3] == ["gpu02", "dgx", f"package {PACKAGE}"] for row in table)
    assert fleet.get("/advisories/ubuntu-usn-5547-1/report.pdf").content.startswith(b"%PDF")


def test_the_pending_report_lists_each_node_and_cve_once_whatever_the_sources(fleet):
    data = fleet.get("/advisories/pending.json").json()
    rows = sorted((r["node"], r["advisory"], r["component"]) for r in data["exposures"])
    # gpu01: its package's USN (NVIDIA's row for the same CVEs is that finding); gpu02: fixed by its package,
    # nothing pending; gpu03: NVIDIA's runfile, NVIDIA's bulletin alone.
    assert rows == [("gpu01", "ubuntu-usn-5547-1", f"package {PACKAGE}"), ("gpu03", "nvidia-5383", "driver")]


def test_a_kernel_installed_but_not_running_is_not_in_the_execute_path():
    """linux-nvidia's 5.15.0-1042 kernel is installed but the node boots the generic one: USN-7328-2's
    vulnerable kernel does not run (vulnerable_code_not_in_execute_path); a node with no linux-nvidia
    kernel at all has none of it (component_not_present)."""
    cluster = Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)
    generic = kernel_packages("5.15.0-91", "5.15.0-91.101", "generic", "linux")
    report(add_node(cluster, "both"), kernel_packages("5.15.0-1042", "5.15.0-1042.42") + generic,
           kernel="5.15.0-91-generic")
    report(add_node(cluster, "generic"), generic, kernel="5.15.0-91-generic")
    ingest_documents(resolve(str(OSV / "USN-7328-2.json")).items())
    document = vex_document(Advisory.objects.filter(publisher_id="USN-7328-2"))
    assert schema_errors(document) == [] and failed_mandatory_tests(document) == []
    assert _justified(document, "CVE-2024-56672") == {
        "dgx/both/linux-nvidia": "vulnerable_code_not_in_execute_path",
        "dgx/generic/linux-nvidia": "component_not_present",
    }
