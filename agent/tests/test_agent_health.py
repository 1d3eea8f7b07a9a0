"""Health gates and rollback on the agent: the parsers on recorded samples, and real agents
running real scripts.

No GPU, NVML or DCGM is on this project's machines: the GPU and DCGM parsers are tested on
output recorded in the formats NVIDIA documents (data/), the agents run stand-in scripts that
print those samples in place of nvidia-smi and dcgmi, and NVML is a stand-in library compiled
here with NVML's documented signatures. They are untested on a GPU here.
The package manager is the recording stand-in (gpusweep_agent.packages.RecordingPackageManager).
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import DATA, FACTS, AgentProcess
from gpusweep_agent.config import load_config
from gpusweep_agent.health import HealthRequest
from gpusweep_agent.health.dcgm import DcgmParseError, parse_diag
from gpusweep_agent.health.gpus import GpuReadError, GpusCheck, evaluate, parse_gpu_query, read_nvml
from gpusweep_agent.packages import parse_dpkg_installed, parse_rpm_installed

from conftest import need

NEW, OLD = "570.195.03", "570.86.15"


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_it_reads_every_gpu_and_its_driver_from_nvidia_smi_output() -> None:
    gpus = parse_gpu_query((DATA / "nvidia-smi-gpus.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2, 3] and gpus[2].uuid.startswith("GPU-0b9e8d77")
    assert evaluate(gpus, NEW, 4)[0]
    healthy, summary, _ = evaluate(gpus[:3], NEW, 4)
    assert not healthy and "3 of 4 GPUs visible" in summary
    healthy, summary, _ = evaluate(gpus, OLD, 4)
    assert not healthy and f"instead of {OLD}" in summary
    with pytest.raises(GpuReadError):
        parse_gpu_query("No devices were found")


def test_it_reads_dcgm_3_and_4_diagnostics() -> None:
    passed = parse_diag((DATA / "dcgm-diag-3-pass.json").read_text())
    assert not passed["failed"] and len(passed["warned"]) == 1 and passed["version"] == "3.3.9"
    assert {"category": "Integration", "test": "PCIe", "target": "GPU 1", "status": "Pass",
            "warnings": []} in passed["tests"]
    failed = parse_diag((DATA / "dcgm-diag-4-fail.json").read_text())
    [memory] = failed["failed"]
    assert memory["test"] == "memory" and memory["target"] == "GPU 1" and "memory mismatch" in memory["warnings"][0]
    for bad in ("Error: unable to connect to host engine", '{"other": 1}'):
        with pytest.raises(DcgmParseError):
            parse_diag(bad)


def test_it_reads_installed_packages_from_dpkg_and_rpm() -> None:
    assert parse_dpkg_installed("nvidia-driver-570\t570.86.15-0ubuntu1\tinstalled\nold\t1\tconfig-files\n") == {
        "nvidia-driver-570": "570.86.15-0ubuntu1"}
    assert parse_rpm_installed("kmod-nvidia-latest-dkms\t3:570.86.15-1.el9\nnvidia-driver\t0:570.86.15-1.el9\n") == {
        "kmod-nvidia-latest-dkms": "3:570.86.15-1.el9", "nvidia-driver": "570.86.15-1.el9"}


@pytest.fixture
def checked_agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    sample = tmp_path / "dcgm-sample.json"
    sample.write_text((DATA / "dcgm-diag-3-pass.json").read_text())
    flag = tmp_path / "ecc-errors"
    smi = script(tmp_path / "nvidia-smi", f"cat {DATA / 'nvidia-smi-gpus.csv'}\n")
    dcgmi = script(tmp_path / "dcgmi", f'[ "$*" = "diag -r 2 -j" ] || exit 9\ncat {sample}\n')
    ecc = script(tmp_path / "check-ecc", f'if [ -e {flag} ]; then cat {flag}; exit 1; fi\necho "ECC: 0 errors"\n')
    options = {"gpus": {"libnvidia_ml": "", "nvidia_smi": str(smi)}, "dcgm": {"dcgmi": str(dcgmi)},
               "site": {"commands": {"ecc": str(ecc), "true": "true"}}}
    facts = {**FACTS, "gpu_count": 4, "components": {"driver": NEW, "cuda": "12.8"}}
    agent = AgentProcess(tmp_path, "h1", tmp_path / "artifacts", facts=facts,
                         health_options=json.dumps(options)).start()
    try:
        yield agent, sample, flag
    finally:
        agent.stop()


def test_a_node_passes_its_gates_and_a_failing_check_fails_them_with_its_output(checked_agent) -> None:
    agent, sample, flag = checked_agent
    request = {"expected": {"driver": NEW}, "gpu_count": 4, "dcgm_level": 2}
    done = agent.client.call("/v1/health-checks", "gate-1", **request)
    assert done["state"] == "succeeded" and done["result"]["passed"], done
    status = {c["name"]: c["status"] for c in done["result"]["checks"]}
    assert status == {"versions": "passed", "gpus": "passed", "dcgm": "passed", "site:ecc": "passed",
                      "site:true": "passed"}
    flag.write_text("GPU 2: 17 uncorrectable ECC errors (volatile)\n")
    sample.write_text((DATA / "dcgm-diag-4-fail.json").read_text())
    failed = agent.client.call("/v1/health-checks", "gate-2", **request)["result"]
    assert not failed["passed"] and sorted(failed["failed"]) == ["dcgm", "site:ecc"]
    ecc = next(c for c in failed["checks"] if c["name"] == "site:ecc")
    assert "17 uncorrectable ECC errors" in ecc["output"] and ecc["detail"]["exit_code"] == 1
    assert "memory on GPU 1" in next(c for c in failed["checks"] if c["name"] == "dcgm")["summary"]
    # The same operation id again: the first answer, nothing run twice.
    assert agent.client.call("/v1/health-checks", "gate-1", **request)["result"]["passed"]
    wrong = agent.client.call("/v1/health-checks", "gate-3", expected={"driver": OLD}, gpu_count=8,
                              site_checks=["nhc"])["result"]
    assert sorted(wrong["failed"]) == ["gpus", "site:nhc", "versions"]
    status, answer = agent.client.request("POST", "/v1/health-checks", {"operation_id": "gate-4", "dcgm_level": 7})
    assert status == 400 and "dcgm_level" in answer["error"]


def test_a_failed_patch_is_rolled_back_to_the_recorded_packages(tmp_path: Path) -> None:
    db = tmp_path / "packages.json"
    db.write_text(json.dumps({"installed": {"nvidia-driver-570": f"{OLD}-1", "nvidia-utils-570": f"{OLD}-1",
                                            "bash": "5.2.15-2"}}))
    # A real script that upgrades half the packages, then fails as a broken postinst would.
    patch = script(tmp_path / "site-patch", f"{sys.executable} -m gpusweep_agent.packages --db {db} install "
                   f"nvidia-driver-570=$2-1\necho 'dpkg: error processing package nvidia-utils-570'\nexit 1\n")
    facts = {k: v for k, v in FACTS.items() if k != "components"}
    agent = AgentProcess(tmp_path, "r1", tmp_path / "artifacts", facts={**facts, "components": {"cuda": "12.8"}},
                         probes="packages", package_manager="recording", package_db=str(db),
                         reboot_command="simulate",
                         patch_methods=json.dumps({"script": {"path": str(patch)}})).start()
    try:
        assert agent.client.get("/v1/facts")["components"]["driver"] == OLD
        failed = agent.client.call("/v1/patch", "gs-1-2-patch", component="driver", version=NEW, method="script",
                                   owner="gs-1-2")
        assert failed["state"] == "failed" and "error processing package" in failed["error"]
        assert failed["result"]["previous"] == {"version": OLD, "packages": {
            "nvidia-driver-570": f"{OLD}-1", "nvidia-utils-570": f"{OLD}-1"}}
        assert agent.client.get("/v1/facts")["components"]["driver"] == NEW, "half upgraded"
        back = agent.client.call("/v1/rollback", "gs-1-2-rollback", owner="gs-1-2")
        assert back["state"] == "succeeded", back
        assert back["result"]["reinstalled"] == {"nvidia-driver-570": f"{OLD}-1", "nvidia-utils-570": f"{OLD}-1"}
        assert agent.client.get("/v1/facts")["components"]["driver"] == OLD
        installs = json.loads(db.read_text())["installs"]
        assert [i["packages"] for i in installs] == [{"nvidia-driver-570": f"{NEW}-1"}, back["result"]["reinstalled"]]
        nothing = agent.client.call("/v1/rollback", "gs-9-9-rollback", owner="gs-9-9")
        assert nothing["state"] == "failed" and "nothing recorded" in nothing["error"]
    finally:
        agent.stop()


def test_it_reads_gpus_through_nvml_by_ctypes_against_a_stand_in_library(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """libnvidia-ml is a stand-in compiled here (data/libnvml_standin.c) with NVML's documented signatures."""
    need(shutil.which("gcc") is not None, "needs gcc (apt-get install build-essential)")
    library = tmp_path / "libnvml-standin.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(DATA / "libnvml_standin.c")], check=True)
    monkeypatch.setenv("NVML_STANDIN_COUNT", "4")
    gpus = read_nvml(str(library))
    assert gpus is not None and [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[3].uuid == "GPU-00000000-0000-4000-8000-000000000003" and gpus[0].driver == NEW
    assert read_nvml(str(tmp_path / "absent.so")) is None
    config = load_config(environ={"GPUSWEEP_AGENT_KEY": "k", "GPUSWEEP_AGENT_STATE_DIR": str(tmp_path)})
    check = GpusCheck(config, {"libnvidia_ml": str(library), "nvidia_smi": "absent-nvidia-smi"})
    [passed] = check.run(HealthRequest(expected={"driver": NEW}, gpu_count=4), {})
    assert passed.status == "passed" and passed.detail["source"] == "nvml"
    monkeypatch.setenv("NVML_STANDIN_COUNT", "3")  # a GPU fell off the bus
    [missing] = check.run(HealthRequest(expected={"driver": NEW}, gpu_count=4), {})
    assert missing.status == "failed" and "3 of 4 GPUs visible" in missing.summary
    monkeypatch.setenv("NVML_STANDIN_FAIL_INIT", "1")
    [broken] = check.run(HealthRequest(expected={"driver": NEW}, gpu_count=4), {})
    assert broken.status == "failed" and "nvmlInit_v2 returned 9" in broken.summary
