"""The heartbeat's os object: os-release, packages with their source, running kernel, livepatch."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpusweep_agent.heartbeat import content_digest
from gpusweep_agent.osinfo import OsProbe, parse_canonical_livepatch, parse_dpkg, parse_kpatch_list, parse_rpm

DPKG = ("linux-image-5.15.0-1042-nvidia\t5.15.0-1042.42\tamd64\tlinux-signed-nvidia\t5.15.0-1042.42\tinstalled\n"
        "nvidia-kernel-common-570-server\t570.172.08-0ubuntu0.22.04.1\tamd64\tnvidia-graphics-drivers-570-server"
        "\t570.172.08-0ubuntu0.22.04.1\tinstalled\n"
        "bash\t5.1-6ubuntu1\tamd64\t\t\tinstalled\n"
        "old-thing\t1.0\tamd64\told\t1.0\tconfig-files\n")
RPM = ("kernel-core\t0:5.14.0-427.13.1.el9_4\tx86_64\tkernel-5.14.0-427.13.1.el9_4.src.rpm\n"
       "shadow-utils\t2:4.9-8.el9\tx86_64\tshadow-utils-4.9-8.el9.src.rpm\n"
       "gpg-pubkey\t0:fd431d51-4ae0493b\t(none)\t(none)\n")


def test_dpkg_rows_name_the_source_package_and_skip_removed_ones():
    rows = parse_dpkg(DPKG)
    assert rows[0] == ["linux-image-5.15.0-1042-nvidia", "5.15.0-1042.42", "amd64", "linux-signed-nvidia",
                       "5.15.0-1042.42"]
    assert rows[1][3] == "nvidia-graphics-drivers-570-server"
    assert rows[2] == ["bash", "5.1-6ubuntu1", "amd64", "bash", "5.1-6ubuntu1"]  # its own source
    assert len(rows) == 3


def test_rpm_rows_take_the_source_from_the_source_rpm_and_drop_epoch_zero():
    rows = parse_rpm(RPM)
    assert rows == [["kernel-core", "5.14.0-427.13.1.el9_4", "x86_64", "kernel", "5.14.0-427.13.1.el9_4"],
                    ["shadow-utils", "2:4.9-8.el9", "x86_64", "shadow-utils", "4.9-8.el9"]]


def test_canonical_livepatch_status():
    status = {"client-version": "10.8.3", "status": [{"kernel": "5.15.0-1042.42-nvidia", "running": True,
              "livepatch": {"checkState": "checked", "state": "applied", "version": "66.1",
                            "fixes": [{"name": "cve-2020-8647", "patched": True},
                                      {"name": "cve-2020-8648", "patched": False}]}}]}
    assert parse_canonical_livepatch(json.dumps(status)) == {
        "tool": "canonical-livepatch", "state": "applied", "version": "66", "fixes": ["CVE-2020-8647"]}
    assert parse_canonical_livepatch("not json") is None


def test_kpatch_list():
    output = ("Loaded patch modules:\nkpatch_5_14_0_427_13_1 [enabled]\n\n"
              "Installed patch modules:\nkpatch_5_14_0_427_13_1 (5.14.0-427.13.1.el9_4.x86_64)\n")
    assert parse_kpatch_list(output) == {"tool": "kpatch", "state": "applied", "modules": ["kpatch_5_14_0_427_13_1"],
                                         "fixes": []}
    assert parse_kpatch_list("Loaded patch modules:\n\nInstalled patch modules:\n")["state"] == "nothing-to-apply"


def fake_root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text('ID=ubuntu\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy\n'
                                             'VERSION="22.04.4 LTS (Jammy Jellyfish)"\n')
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text("")
    return tmp_path


def test_the_probe_reports_and_reads_packages_again_only_when_the_database_changes(tmp_path):
    root = fake_root(tmp_path)
    calls: list[str] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv[0])
        return DPKG if argv[0] == "dpkg-query" else None

    probe = OsProbe(root, run, uname=lambda: "5.15.0-1042-nvidia")
    report = probe.report()
    assert report is not None
    assert report["release"]["VERSION_CODENAME"] == "jammy" and report["running_kernel"] == "5.15.0-1042-nvidia"
    assert len(report["packages"]) == 3 and report["livepatch"] is None
    probe.report()
    assert calls.count("dpkg-query") == 1  # unchanged database: the list is kept
    status = root / "var/lib/dpkg/status"
    os.utime(status, (status.stat().st_mtime + 10, status.stat().st_mtime + 10))
    probe.report()
    assert calls.count("dpkg-query") == 2


def test_a_node_without_any_of_it_reports_nothing_and_keeps_its_digest(tmp_path):
    assert OsProbe(tmp_path, lambda argv: None, uname=lambda: "6.1.0").report() is None
    payload = {"endpoint": "x", "facts": {}, "workloads": []}
    assert content_digest(payload) == content_digest({**payload, "os": None})
    assert content_digest(payload) != content_digest({**payload, "os": {"running_kernel": "6.1.0"}})
