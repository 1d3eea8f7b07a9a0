"""Every miss issue 14 found was silent; each now shows as a state a user can see.

Plus done-when 1 on NVIDIA's corpus (every row decoded or listed for review, with a reason) and
the demo fleet's exposures, which must not change.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from advisories import csaf
from advisories.exposure import recompute
from advisories.ingest import ingest_documents
from advisories.models import Advisory, AdvisoryEvent, Exposure, ReviewItem
from advisories.sources import FolderSource
from campaigns.management.commands.demo_fleet import CLUSTER, GPU_MODEL
from campaigns.management.commands.demo_fleet import Command as DemoFleet
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, add_node, bulletins

pytestmark = pytest.mark.django_db
TEST_CSAF = FIXTURES.parent / "test-csaf"


def ingest(*paths: Path) -> str:
    out = io.StringIO()
    for path in paths:
        call_command("ingest_advisories", str(path), "--no-progress", stdout=out)
    return out.getvalue()


def exposures_table(*args: str) -> str:
    out = io.StringIO()
    call_command("exposures", *args, stdout=out)
    return out.getvalue()


def test_a_toolkit_bulletin_conditioned_on_cdi_mode_exposes_toolkit_nodes():
    ingest(TEST_CSAF / "9001.json")
    cluster = Cluster.objects.create(name="k8s", kind="static")
    add_node(cluster, "gpu01", container_toolkit="1.17.4")  # mode unknown: the condition is assumed met
    recompute()
    text = exposures_table("--advisory", "9001")
    assert "gpu01" in text and "1 exposure(s)" in text
    # The device plugin is a product no component maps to: the advisory says so.
    assert "needs review: 2 item(s)" in text


def test_a_bare_affected_release_is_affected_not_fixed():
    ingest(TEST_CSAF / "9002.json")
    triton = Advisory.objects.get(publisher_id="9002").ranges.get(component="triton", basis="decoded")
    assert (triton.lower_version, triton.upper_version, triton.upper_inclusive) == ("24.11", "24.11", True)
    cluster = Cluster.objects.create(name="inference", kind="static")
    add_node(cluster, "infer01", triton="24.11")
    recompute()
    assert Exposure.objects.get().node.name == "infer01"


def test_a_vbios_range_decodes_and_never_matches_another_products_firmware():
    ingest(TEST_CSAF / "9003.json", FIXTURES / "5367.json")
    vbios = Advisory.objects.get(publisher_id="9003").ranges.get(component="vbios", scope={"gpu_model": "a100"})
    assert (vbios.upper_version, vbios.upper_inclusive) == ("92.00.45.00.03", True)
    cluster = Cluster.objects.create(name="dgx", kind="static")
    node = add_node(cluster, "dgx-a100-01", vbios="22.4.1", system_firmware="22.5.5")
    node.gpu_model, node.facts = "NVIDIA A100-SXM4-80GB", {"platform": "DGX A100"}
    node.save()
    recompute()
    # 22.4.1 is below DGX A100's firmware fix 22.5.5, but it is a VBIOS version: only the A100 VBIOS row hits.
    assert list(Exposure.objects.values_list("advisory__publisher_id", "component", "state")) == [
        ("9003", "vbios", "open")]


def test_a_driver_branch_the_bulletin_skips_is_presumed_exposed_and_counted(client: Client):
    ingest(FIXTURES / "5703.json")
    cluster = Cluster.objects.create(name="prod", kind="static")
    add_node(cluster, "old-branch", driver="550.163.01")
    recompute()
    exposure = Exposure.objects.get()
    assert (exposure.state, exposure.deadline is not None) == ("presumed", True)
    assert exposure.affected_range.remediation == "move to a supported branch: R570 570.195.03 or R535 535.274.02"
    text = exposures_table("--advisory", "5703")
    assert "old-branch" in text and "1 of them presumed" in text
    user = User.objects.create_user("vera")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    page = client.get("/").content.decode()
    assert "1 advisory needs review" in page and "1 node presumed exposed" in page


def test_vgpu_manager_rows_keep_their_own_branch_and_every_fixed_form():
    parsed = csaf.parse((TEST_CSAF / "9004.json").read_bytes(), "9004.json")
    manager = {(r.branch, r.upper, r.fixed_version) for r in parsed.ranges
               if r.product_line == "vgpu_manager" and r.basis == "decoded"}
    # "vGPU software 19.2" alone maps to the manager's own 19.2 driver from its vSphere row.
    assert manager == {("R580", "580.82.02", "580.95.02"), ("R570", "570.172.07", "570.195.02")}
    tesla = {(r.branch, r.fixed_version) for r in parsed.ranges if r.product_line == "tesla" and r.basis == "decoded"}
    assert ("R580", "580.95.05") in tesla  # "580.95.05 or newer"


def test_a_mislabelled_vgpu_row_takes_the_branch_of_its_versions(shared_csaf):
    parsed = csaf.parse((shared_csaf / "5520.json").read_bytes(), "5520.json")
    guest = {r.branch for r in parsed.ranges if r.product_line == "vgpu_guest" and r.os_family == "windows"
             and r.basis == "decoded"}
    assert guest == {"R535", "R470"}  # "Windows(R570 vGPU 13)" over 474.64 is R470


def test_a_folder_reads_the_cve_index_and_reports_each_unreadable_file(tmp_path: Path):
    shutil.copy(FIXTURES / "5582.json", tmp_path / "5582.json")
    (tmp_path / "broken.json").symlink_to(tmp_path / "nowhere.json")
    bad = json.loads((FIXTURES / "5614.json").read_bytes())
    bad["document"]["tracking"]["version"] = "x"
    (tmp_path / "5614.json").write_text(json.dumps(bad))
    (tmp_path / "CVE_index_2025.csv").write_text(
        "CVE;CVSS;Severity;Vector;CWE;Bulletin;Affected Product;Affected Version;Fixed In\n"
        "CVE-2099-0001;7.5;HIGH;CVSS:3.1/AV:L;CWE-20;9100;Triton Inference Server;All versions prior to 25.07;25.07\n"
        "CVE-2099-0002;5.0;MEDIUM;CVSS:3.1/AV:L;CWE-20;9100;NVIDIA Jetson Orin;All versions prior to 36.4;36.4\n"
        "CVE-2024-0132;9.0;CRITICAL;CVSS:3.1/AV:N;CWE-367;5582;NVIDIA Container Toolkit;1.16.1 and earlier;1.16.2\n")
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    summary = ingest_documents(FolderSource(str(tmp_path)).items())
    lines = "\n".join(summary.document_lines())
    assert f"{tmp_path / 'broken.json'}: rejected: cannot read: broken symbolic link" in lines
    assert f"{tmp_path / '5614.json'}: rejected: document.tracking.version 'x' is not a CSAF version" in lines
    assert f"{tmp_path / '5582.json'}: new" in lines
    assert f"{tmp_path / 'CVE_index_2025.csv'}: 2 bulletins: new 1, unchanged 1" in lines
    assert f"{tmp_path / 'notes.csv'}: skipped: a CSV file that is not NVIDIA's CVE index" in lines
    index_only = Advisory.objects.get(publisher_id="9100")
    assert index_only.ranges_unknown and index_only.severity == "high"
    assert sorted(index_only.review_items.values_list("component", "kind")) == [("", "index_only"),
                                                                               ("triton", "index_only")]
    assert not Advisory.objects.get(publisher_id="5582").ranges_unknown  # its CSAF is kept
    assert AdvisoryEvent.objects.filter(kind="rejected", document=str(tmp_path / "5614.json")).exists()
    # The real revision arriving later is ingested: "x" never became a version to compare with.
    shutil.copy(FIXTURES / "5614.json", tmp_path / "5614.json")
    again = ingest_documents(FolderSource(str(tmp_path)).items())
    assert again.outcomes[str(tmp_path / "5614.json")][0].startswith("new")


def test_every_row_of_nvidias_corpus_is_decoded_or_listed_for_review(shared_csaf):
    """Done-when 1: no product_version leaf is silently dropped, and every review item says why."""
    for path in bulletins(shared_csaf):
        parsed = csaf.parse(path.read_bytes(), path.name)
        data = json.loads(path.read_bytes())
        leaves = _product_ids(data, "product_version")
        used = {r.product_id.split("#")[0] for r in parsed.ranges} | {r.fixed_product_id for r in parsed.ranges}
        listed = {n.key for n in parsed.review}
        # A second fixed row of one affected row (575.274.02 and 575.274.03) decodes but pairs with none.
        prefixes = sorted(_product_ids(data, "product_name"), key=len, reverse=True)
        texts = {pid: next((pid[len(p) + 1:] for p in prefixes if pid.startswith(p + "_")), pid) for pid in leaves}
        extra_fixed = {pid for pid, text in texts.items()
                       if (d := csaf.decode_version_text(text)) and d.kind == "fixed"}
        assert [pid for pid in leaves if pid not in used | listed | extra_fixed] == [], path.name
        assert all(n.reason for n in parsed.review)
    ingest_documents(FolderSource(str(shared_csaf)).items())
    assert not ReviewItem.objects.filter(reason="").exists()


def _product_ids(data: dict, category: str) -> list[str]:
    found: list[str] = []

    def walk(branches: list[dict]) -> None:
        for b in branches:
            if b["category"] == category:
                found.append(b["product"]["product_id"])
            walk(b.get("branches", []))

    walk(data["product_tree"]["branches"])
    return found


def test_the_demo_fleets_exposures_are_unchanged(shared_csaf):
    """demo_fleet's layout against the whole corpus: 5703 alone, open, below its R570/R580 fixes."""
    ingest_documents(FolderSource(str(shared_csaf)).items())
    cluster = Cluster.objects.create(name=CLUSTER, kind="static")
    for name, driver, pool in DemoFleet._layout(10):
        node = add_node(cluster, name, driver=driver, cuda="12.8" if driver.startswith("570") else "13.0")
        node.gpu_model, node.gpu_count, node.pool = GPU_MODEL, 8, pool
        node.save()
    recompute()
    rows = set(Exposure.objects.values_list("node__name", "advisory__publisher_id", "state", "detected_version"))
    below = {(name, "5703", "open", driver) for name, driver, _pool in DemoFleet._layout(10)
             if driver in ("570.172.08", "580.82.07")}
    assert rows == below and len(below) == 9
