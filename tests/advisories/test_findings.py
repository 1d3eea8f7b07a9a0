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
