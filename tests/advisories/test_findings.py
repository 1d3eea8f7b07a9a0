"""NVIDIA's bulletin and Ubuntu's USN for the same driver CVE: one finding with two sources."""

from __future__ import annotations

import pytest

from advisories.findings import findings
from advisories.ingest import ingest_documents
from advisories.sources import resolve
from inventory.choices import ClusterKind
from inventory.models import Cluster, Node
from tests.advisories.conftest import add_node, set_version
from tests.advisories.test_osmatch import DRIVER_FIXED, DRIVER_OLD, driver_packages, report
from tests.advisories.test_osv_ingest import OSV

pytestmark = pytest.mark.django_db


def finding(node: Node, cve_id: str):
    [found] = [f for f in findings(node_ids=[node.id]) if f.cve_id == cve_id]
    return found


def test_a_packaged_driver_is_one_finding_of_both_sources_closed_by_the_distributions_fix():
    cluster = Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)
    node = add_node(cluster, "gpu01", driver="515.48.07")
    report(node, driver_packages(DRIVER_OLD))
    ingest_documents(resolve(str(OSV / "nvidia-5383.json")).items())
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    found = finding(node, "CVE-2022-31607")
    assert sorted((s.publisher, s.publisher_id, s.state) for s in found.sources) == [
        ("NVIDIA", "5383", "open"), ("Ubuntu", "USN-5547-1", "open")]
    assert found.state == "open"
    # The package update: Ubuntu's fix applies to this node's packaging and closes the finding.
    report(node, driver_packages(DRIVER_FIXED), reference="campaign 3, sweep 7")
    set_version(node, "driver", "515.65.01")
    found = finding(node, "CVE-2022-31607")
    assert found.state == "remediated"
    assert [s.publisher for s in found.deciding] == ["Ubuntu"]


def test_a_runfile_driver_is_judged_by_nvidias_bulletin_alone():
    cluster = Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)
    node = add_node(cluster, "gpu01", driver="515.48.07")
    report(node, [])  # Ubuntu, but no distribution driver package
    ingest_documents(resolve(str(OSV / "nvidia-5383.json")).items())
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    found = finding(node, "CVE-2022-31607")
    assert [(s.publisher, s.state) for s in found.sources] == [("NVIDIA", "open")]
    assert found.state == "open"


@pytest.fixture
def packaged(client):
    """A node whose driver is Ubuntu's package (exposed by NVIDIA 5383 and USN-5547-1 for the same CVEs), a
    node with NVIDIA's runfile (NVIDIA's alone), and a viewer logged in to the API and the console."""
    from django.contrib.auth.models import Group, User

    cluster = Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)
    node = add_node(cluster, "gpu01", driver="515.48.07")
    report(node, driver_packages(DRIVER_OLD))
    runfile = add_node(cluster, "gpu02", driver="515.48.07")
    report(runfile, [])
    ingest_documents(resolve(str(OSV / "nvidia-5383.json")).items())
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    user = User.objects.create_user("viewer-user", password="pw-long-enough-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return node, runfile


def _rows(client, query: str = "") -> list[tuple[str, str, str]]:
    rows = client.get(f"/api/v1/advisories/exposures/?state=open{query}").json()["results"]
    return sorted((r["node_name"], r["advisory"], r["source"]) for r in rows)


def test_the_api_lists_one_row_per_node_and_cve_with_both_sources_and_filters_by_source(packaged, client):
    _node, runfile = packaged
    assert _rows(client) == [("gpu01", "ubuntu-usn-5547-1", "distribution"), ("gpu02", "nvidia-5383", "nvidia")]
    [usn] = client.get("/api/v1/advisories/exposures/?source=distribution").json()["results"]
    assert usn["finding"]["state"] == "open"
    assert {(s["advisory"], s["decides"]) for s in usn["finding"]["sources"]} == {
        ("nvidia-5383", False), ("ubuntu-usn-5547-1", True)}
    assert _rows(client, "&source=nvidia") == [("gpu01", "nvidia-5383", "nvidia"), ("gpu02", "nvidia-5383", "nvidia")]
    assert _rows(client, "&source=distribution") == [("gpu01", "ubuntu-usn-5547-1", "distribution")]
    assert len(_rows(client, "&joined=false")) == 3
    runfile_row = client.get(f"/api/v1/advisories/exposures/?node={runfile.pk}").json()["results"][0]
    assert runfile_row["finding"] is None  # one source: nothing joined
    assert client.get("/api/v1/advisories/exposures/?source=debian").status_code == 400


def test_the_console_lists_one_row_per_finding_and_filters_by_source(packaged, client):
    page = client.get("/advisories/exposures/").content.decode()
    table = page[page.index('id="exposure-table"'):]
    assert table.count("<tr>") == 3  # the header, gpu01 (its finding) and gpu02
    assert "nvidia-5383: open</li>" in table and "ubuntu-usn-5547-1: open (decides: the package the node runs)" in table
    assert 'Distribution advisories (OSV)</option>' in page  # the source filter
    nvidia = client.get("/advisories/exposures/?source=nvidia").content.decode()
    assert nvidia[nvidia.index('id="exposure-table"'):].count("NVIDIA 5383") == 2
    assert "USN-5547-1" not in nvidia[nvidia.index('id="exposure-table"'):].replace("ubuntu-usn-5547-1", "")

