"""OS package advisories matched on package sets: the packaged NVIDIA driver, the kernel by the
version that runs ("reboot pending"), livepatch remediating without a sweep."""

from __future__ import annotations

import json

import pytest

from advisories.ingest import ingest_documents
from advisories.models import Exposure
from advisories.osmatch import recompute_os
from advisories.sources import resolve
from inventory.choices import ClusterKind
from inventory.models import Cluster, Node, Package, PackageSet
from inventory.packages import apply_os_report, parse_os_report
from tests.advisories.test_osv_ingest import OSV, record, write

pytestmark = pytest.mark.django_db

JAMMY = {"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION_CODENAME": "jammy", "VERSION": "22.04.4 LTS (Jammy Jellyfish)"}
BIONIC = {"ID": "ubuntu", "VERSION_ID": "18.04", "VERSION_CODENAME": "bionic", "VERSION": "18.04.6 LTS"}
DRIVER_OLD = "515.48.07-0ubuntu0.22.04.2"
DRIVER_FIXED = "515.65.01-0ubuntu0.22.04.1"  # USN-5547-1's fix for nvidia-graphics-drivers-515-server


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.objects.create(name="dgx", kind=ClusterKind.STATIC)


def kernel_packages(abi: str, version: str, flavour: str = "nvidia", source: str = "linux-nvidia") -> list[list[str]]:
    return [[f"linux-image-{abi}-{flavour}", version, "amd64", f"linux-signed-{flavour}", version],
            [f"linux-modules-{abi}-{flavour}", version, "amd64", source, version]]


def driver_packages(version: str) -> list[list[str]]:
    return [["nvidia-kernel-common-515-server", version, "amd64", "nvidia-graphics-drivers-515-server", version],
            ["libnvidia-compute-515-server", version, "amd64", "nvidia-graphics-drivers-515-server", version]]


def report(node: Node, packages: list[list[str]], kernel: str = "", release: dict | None = None,
           livepatch: dict | None = None, reference: str = "agent") -> None:
    os = {"release": release or JAMMY, "packages": [["bash", "5.1-6ubuntu1", "amd64"], *packages],
          "running_kernel": kernel, "livepatch": livepatch}
    parsed = parse_os_report({"os": os})
    apply_os_report(node.id, parsed, reference)
    recompute_os(node_ids=[node.id], remediated_by=reference)


def exposures(node: Node) -> list[tuple[str, str, str, str]]:
    return sorted(Exposure.objects.filter(node=node).values_list("advisory__publisher_id", "state",
                                                                 "detected_version", "note"))


def test_a_packaged_driver_below_the_usn_fix_is_exposed_until_the_package_is_updated(cluster):
    node = Node.objects.create(cluster=cluster, name="gpu01")
    report(node, driver_packages(DRIVER_OLD))
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    exposure = Exposure.objects.get(node=node)
    assert (exposure.state, exposure.detected_version) == ("open", DRIVER_OLD)
    assert exposure.affected_range.product_id == "Ubuntu:22.04:LTS/nvidia-graphics-drivers-515-server"
    # The range's severity (the worst of its CVEs': CVE-2022-31607 is high) decides the deadline.
    assert exposure.severity == "high" and exposure.deadline_source and exposure.deadline is not None
    report(node, driver_packages(DRIVER_FIXED), reference="campaign 3, sweep 7")
    exposure.refresh_from_db()
    assert (exposure.state, exposure.fixed_by_version, exposure.remediated_by) == (
        "remediated", DRIVER_FIXED, "campaign 3, sweep 7")
    assert exposure.remediated_at is not None


def test_another_release_or_no_driver_is_not_exposed(cluster):
    focal = Node.objects.create(cluster=cluster, name="focal")
    report(focal, driver_packages(DRIVER_OLD), release={"ID": "ubuntu", "VERSION_ID": "24.04", "VERSION": "LTS"})
    bare = Node.objects.create(cluster=cluster, name="bare")
    report(bare, [])
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    assert not Exposure.objects.exists()


def test_nodes_of_one_image_share_one_package_set(cluster):
    nodes = [Node.objects.create(cluster=cluster, name=f"gpu{i:02}") for i in range(5)]
    for node in nodes:
        report(node, driver_packages(DRIVER_OLD))
    assert PackageSet.objects.count() == 1
    assert Package.objects.count() == 3
    assert PackageSet.objects.get().ecosystem == "Ubuntu:22.04:LTS"
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    assert Exposure.objects.filter(state="open").count() == 5


def test_a_fixed_kernel_installed_but_not_booted_stays_exposed_with_reboot_pending(cluster):
    node = Node.objects.create(cluster=cluster, name="gpu01")
    installed = kernel_packages("5.15.0-1042", "5.15.0-1042.42") + kernel_packages("5.15.0-1073", "5.15.0-1073.74")
    report(node, installed, kernel="5.15.0-1042-nvidia")
    ingest_documents(resolve(str(OSV / "USN-7328-2.json")).items())
    [(usn, state, version, note)] = exposures(node)
    assert (usn, state, version) == ("USN-7328-2", "open", "5.15.0-1042.42")
    assert note == "reboot pending: 5.15.0-1073.74 is installed, 5.15.0-1042-nvidia runs"
    # The reboot: the fixed kernel runs now.
    report(node, installed, kernel="5.15.0-1073-nvidia", reference="campaign 4, sweep 9")
    exposure = Exposure.objects.get(node=node)
    assert (exposure.state, exposure.fixed_by_version, exposure.remediated_by) == (
        "remediated", "5.15.0-1073.74", "campaign 4, sweep 9")


def test_an_old_kernel_installed_but_not_running_exposes_nothing(cluster):
    node = Node.objects.create(cluster=cluster, name="gpu01")
    installed = kernel_packages("5.15.0-1042", "5.15.0-1042.42") + kernel_packages("5.15.0-1073", "5.15.0-1073.74")
    report(node, installed, kernel="5.15.0-1073-nvidia")
    generic = Node.objects.create(cluster=cluster, name="generic")
    report(generic, kernel_packages("5.15.0-91", "5.15.0-91.101", "generic", "linux"), kernel="5.15.0-91-generic")
    ingest_documents(resolve(str(OSV / "USN-7328-2.json")).items())
    assert not Exposure.objects.exists()


def test_a_running_kernel_whose_package_is_gone_compares_by_its_abi(cluster):
    node = Node.objects.create(cluster=cluster, name="gpu01")
    report(node, kernel_packages("5.15.0-1073", "5.15.0-1073.74"), kernel="5.15.0-1042-nvidia")
    ingest_documents(resolve(str(OSV / "USN-7328-2.json")).items())
    assert exposures(node)[0][1:3] == ("open", "5.15.0-1042")


def bionic_kernel_usn(tmp_path):
    """A kernel USN for bionic's generic 4.15 kernel naming LSN-0066-1's CVEs."""
    data = record("USN-7328-2.json")
    data["id"], data["upstream"] = "USN-9999-1", ["CVE-2020-8647", "CVE-2020-8648", "CVE-2020-8649"]
    affected = data["affected"][0]
    affected["package"] = {"ecosystem": "Ubuntu:18.04:LTS", "name": "linux"}
    affected["ranges"][0]["events"][1]["fixed"] = "4.15.0-99.100"
    affected["ecosystem_specific"]["binaries"] = [{"binary_name": "linux-image-4.15.0-99-generic",
                                                   "binary_version": "4.15.0-99.100"}]
    affected.pop("database_specific", None)
    return write(tmp_path, "USN-9999-1.json", data)


def test_a_livepatch_covering_the_running_kernel_remediates_without_a_sweep(cluster, tmp_path):
    patched = Node.objects.create(cluster=cluster, name="patched")
    unpatched = Node.objects.create(cluster=cluster, name="unpatched")
    packages = kernel_packages("4.15.0-70", "4.15.0-70.79", "generic", "linux")
    livepatch = {"tool": "canonical-livepatch", "state": "applied", "version": "66", "fixes": []}
    report(patched, packages, kernel="4.15.0-70-generic", release=BIONIC, livepatch=livepatch)
    report(unpatched, packages, kernel="4.15.0-70-generic", release=BIONIC,
           livepatch={**livepatch, "version": "65"})
    ingest_documents(resolve(str(bionic_kernel_usn(tmp_path))).items())
    assert [e[1] for e in exposures(patched)] == ["open"]  # no notice yet
    ingest_documents(resolve(str(OSV / "LSN-0066-1.json")).items())
    exposure = Exposure.objects.get(node=patched)
    assert (exposure.state, exposure.note, exposure.remediated_by) == (
        "remediated", "livepatch LSN-0066-1", "livepatch LSN-0066-1")
    assert [e[1] for e in exposures(unpatched)] == ["open"]  # livepatch 65 predates the fix


def test_the_agents_own_livepatch_report_of_fixes_counts(cluster, tmp_path):
    node = Node.objects.create(cluster=cluster, name="gpu01")
    ingest_documents(resolve(str(bionic_kernel_usn(tmp_path))).items())
    some = {"tool": "kpatch", "state": "applied", "fixes": ["CVE-2020-8647"]}
    report(node, kernel_packages("4.15.0-70", "4.15.0-70.79", "generic", "linux"), kernel="4.15.0-70-generic",
           release=BIONIC, livepatch=some)
    assert exposures(node)[0][1] == "open"  # two of its three CVEs are not livepatched
    report(node, kernel_packages("4.15.0-70", "4.15.0-70.79", "generic", "linux"), kernel="4.15.0-70-generic",
           release=BIONIC, livepatch={**some, "fixes": ["CVE-2020-8647", "CVE-2020-8648", "CVE-2020-8649"]})
    assert exposures(node)[0][1:] == ("remediated", "4.15.0-70.79", "livepatch (kpatch reports it)")


def test_a_full_sql_recompute_leaves_os_exposures_alone(cluster):
    from advisories.exposure import recompute

    node = Node.objects.create(cluster=cluster, name="gpu01")
    report(node, driver_packages(DRIVER_OLD))
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    recompute()
    assert Exposure.objects.get(node=node).state == "open"
    assert json.loads(json.dumps(recompute_os().__dict__))["opened"] == 0  # idempotent


def test_the_plan_says_livepatch_where_a_notice_covers_the_running_kernel_and_reboot_for_the_rest(cluster, tmp_path):
    from advisories.osplan import remedies, targets

    covered = Node.objects.create(cluster=cluster, name="covered")
    report(covered, kernel_packages("4.15.0-70", "4.15.0-70.79", "generic", "linux"), kernel="4.15.0-70-generic",
           release=BIONIC, livepatch={"tool": "canonical-livepatch", "state": "nothing-to-apply", "fixes": []})
    too_old = Node.objects.create(cluster=cluster, name="too-old")  # below the notice's base kernel 4.15.0-69
    report(too_old, kernel_packages("4.15.0-60", "4.15.0-60.67", "generic", "linux"), kernel="4.15.0-60-generic",
           release=BIONIC)
    usn = bionic_kernel_usn(tmp_path)
    ingest_documents(resolve(str(usn)).items())
    ingest_documents(resolve(str(OSV / "LSN-0066-1.json")).items())
    plan = remedies([covered.id, too_old.id])
    assert (plan[covered.id].kind, plan[covered.id].livepatch) == ("livepatch", {"LSN-0066-1": 66})
    assert (plan[too_old.id].kind, plan[too_old.id].kernel) == ("reboot", {"linux": "4.15.0-99.100"})
    assert targets(Exposure.objects.get(node=covered).advisory_id) == {"Ubuntu:18.04:LTS": {"linux": "4.15.0-99.100"}}


def test_os_advisories_and_their_exposures_show_in_the_api_and_the_console(client, cluster):
    from django.contrib.auth.models import Group, User

    node = Node.objects.create(cluster=cluster, name="gpu01")
    report(node, driver_packages(DRIVER_OLD))
    ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
    user = User.objects.create_user("viewer-user", password="pw-long-enough-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    advisory = Exposure.objects.get().advisory
    detail = client.get(f"/api/v1/advisories/advisories/{advisory.public_id}/").json()
    assert detail["publisher_id"] == "USN-5547-1" and len(detail["ranges"]) == 24
    rows = client.get("/api/v1/advisories/exposures/").json()["results"]
    assert [r["detected_version"] for r in rows] == [DRIVER_OLD]
    for page in (f"/advisories/{advisory.public_id}/", "/advisories/", "/advisories/exposures/"):
        assert client.get(page).status_code == 200, page


def test_a_distribution_advisory_is_matched_once_and_not_again_by_the_next_batch(cluster, tmp_path):
    """Its advisory is marked matched by the OS match (the SQL match, which has no range of it, is
    skipped), so an ingest of something else does not take it for unmatched and match it again."""
    from unittest import mock

    from advisories import ingest
    from advisories.models import Advisory

    node = Node.objects.create(cluster=cluster, name="gpu01")
    report(node, driver_packages(DRIVER_OLD))
    with mock.patch.object(ingest, "recompute", wraps=ingest.recompute) as sql_match:
        ingest_documents(resolve(str(OSV / "USN-5547-1.json")).items())
        ingest_documents(resolve(str(OSV / "LSN-0066-1.json")).items())
    assert sql_match.call_count == 0
    assert Advisory.objects.filter(exposures_at__isnull=True).count() == 0
    with mock.patch.object(ingest, "recompute_os", wraps=ingest.recompute_os) as os_match:
        ingest_documents(resolve(str(OSV / "USN-7328-2.json")).items())
    [call] = os_match.call_args_list
    assert call.kwargs["advisory_ids"] == [Advisory.objects.get(publisher_id="USN-7328-2").id]
