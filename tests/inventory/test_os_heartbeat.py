"""The heartbeat's os object on the server: package sets stored once per image."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inventory.models import Node, Package, PackageSet
from inventory.packages import apply_os_report, ecosystem_of, parse_os_report
from tests.inventory.test_agent_heartbeat import cluster, fleet_secret, heartbeat_payload, post  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

OS = {"release": {"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION_CODENAME": "jammy", "VERSION": "22.04.4 LTS"},
      "packages": [["linux-image-5.15.0-1042-nvidia", "5.15.0-1042.42", "amd64", "linux-signed-nvidia",
                    "5.15.0-1042.42"], ["bash", "5.1-6ubuntu1", "amd64", "bash", "5.1-6ubuntu1"]],
      "running_kernel": "5.15.0-1042-nvidia", "livepatch": {"tool": "canonical-livepatch", "state": "applied",
                                                            "version": "66", "fixes": []}}


def test_a_heartbeat_with_its_os_points_the_node_at_its_package_set(client, cluster):  # noqa: F811
    answer = post(client, {**heartbeat_payload("570.86.15"), "os": OS})
    assert answer.status_code == 200, answer.content
    node = Node.objects.get(name="gpu01")
    assert node.package_set is not None and node.package_set.ecosystem == "Ubuntu:22.04:LTS"
    assert node.running_kernel == "5.15.0-1042-nvidia" and node.livepatch["state"] == "applied"
    assert Package.objects.get(name="bash").source == "bash"
    # Another node of the image: the same set, no package written again.
    other = post(client, {**heartbeat_payload("570.86.15"), "node": "gpu02", "os": OS}, identity="local/gpu02")
    assert other.status_code == 200, other.content
    assert PackageSet.objects.count() == 1 and Package.objects.count() == 2
    assert Node.objects.get(name="gpu02").package_set_id == node.package_set_id


def test_an_rpm_node_with_three_kernels_installed_reports_each(client, cluster):  # noqa: F811
    """rpm keeps several versions of installonly packages (the kernel's: three by default), under one name
    and arch: `rpm -qa` lists each, and the heartbeat stores each."""
    kernels = [["kernel-core", f"5.14.0-{n}.el9_4", "x86_64", "kernel", f"5.14.0-{n}.el9_4"] for n in (427, 503, 570)]
    alma = {"release": {"ID": "almalinux", "VERSION_ID": "9.4"}, "packages": kernels,
            "running_kernel": "5.14.0-570.el9_4.x86_64", "livepatch": None}
    answer = post(client, {**heartbeat_payload("570.86.15"), "os": alma})
    assert answer.status_code == 200, answer.content
    node = Node.objects.get(name="gpu01")
    assert node.package_set is not None and node.package_set.ecosystem == "AlmaLinux:9"
    assert sorted(Package.objects.filter(name="kernel-core").values_list("version", flat=True)) == [
        "5.14.0-427.el9_4", "5.14.0-503.el9_4", "5.14.0-570.el9_4"]


def test_an_invalid_os_object_is_refused_with_its_field(client, cluster):  # noqa: F811
    answer = post(client, {**heartbeat_payload("570.86.15"), "os": {**OS, "packages": [["bash"]]}})
    assert answer.status_code == 400
    assert "os.packages[0]" in answer.json()["errors"]
    answer = post(client, {**heartbeat_payload("570.86.15"), "os": {**OS, "livepatch": {"state": "sideways"}}})
    assert "os.livepatch" in answer.json()["errors"]


def test_an_unchanged_os_report_writes_nothing(cluster):  # noqa: F811
    node = Node.objects.create(cluster=cluster, name="gpu01")
    report = parse_os_report({"os": OS})
    assert apply_os_report(node.id, report)
    with CaptureQueriesContext(connection) as queries:
        assert not apply_os_report(node.id, report)
    assert len(queries) == 1  # the node's current set, kernel and livepatch: one read, no write


def test_ecosystems_from_os_release():
    assert ecosystem_of({"ID": "ubuntu", "VERSION_ID": "22.04", "VERSION": "22.04.4 LTS (Jammy Jellyfish)"}) \
        == "Ubuntu:22.04:LTS"
    assert ecosystem_of({"ID": "debian", "VERSION_ID": "12"}) == "Debian:12"
    assert ecosystem_of({"ID": "almalinux", "VERSION_ID": "9.4"}) == "AlmaLinux:9"
    assert ecosystem_of({"ID": "rocky", "VERSION_ID": "8.10"}) == "Rocky Linux:8"
    assert ecosystem_of({"ID": "arch"}) == ""


def test_a_full_heartbeat_with_an_unchanged_os_costs_no_statement_more_than_one_without(client, cluster):  # noqa: F811
    """The os object of a heartbeat whose package set, kernel and livepatch the node already has is
    compared with what the heartbeat's lock of the node row read: not one statement more."""
    assert post(client, {**heartbeat_payload("570.86.15"), "os": OS}).status_code == 200
    assert post(client, heartbeat_payload("570.86.15")).status_code == 200  # settled: the same facts each time
    with CaptureQueriesContext(connection) as without_os:
        assert post(client, heartbeat_payload("570.86.15")).status_code == 200
    with CaptureQueriesContext(connection) as with_os:
        assert post(client, {**heartbeat_payload("570.86.15"), "os": OS}).status_code == 200
    def statements(queries: CaptureQueriesContext) -> list[str]:
        # The statements' shapes: their values (counters, digests, times, savepoint names) aside.
        return [re.sub(r"SAVEPOINT \S+|'[^']*'|\b\d+\b", "?", q["sql"]) for q in queries]

    assert statements(with_os) == statements(without_os)
    # A changed kernel is written (and an unchanged set still reads no package).
    with CaptureQueriesContext(connection) as changed:
        moved = {**OS, "running_kernel": "5.15.0-1073-nvidia"}
        assert post(client, {**heartbeat_payload("570.86.15"), "os": moved}).status_code == 200
    assert Node.objects.get(name="gpu01").running_kernel == "5.15.0-1073-nvidia"
    assert not any("inventory_package" in q["sql"] and "INSERT" in q["sql"] for q in changed)
