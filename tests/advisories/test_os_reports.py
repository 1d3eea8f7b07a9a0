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
from tests.advisories.test_osmatch import DRIVER_FIXED, DRIVER_OLD, driver_packages, report
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
    status = statuses(document, "CVE-2022-31607")
    assert status == {"known_affected": [f"dgx/gpu01/{PACKAGE}"], "fixed": [f"dgx/gpu02/{PACKAGE}"]}
    [vuln] = [v for v in document["vulnerabilities"] if v["cve"] == "CVE-2022-31607"]
    assert vuln["remediations"] == [
        {
            "category": "vendor_fix",
            "details": f"update {PACKAGE} to {DRIVER_FIXED}",
            "product_ids": [f"dgx/gpu01/{PACKAGE}"],
        }
    ]
    assert "https://osv.dev/vulnerability/USN-5547-1" in {r["url"] for r in document["document"]["references"]}


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
