"""The agent's /v1 API through a real agent process: authentication, operations, patch and reboot,
and the signal and none engines end to end (no CRIU needed)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import CLUSTER, FLEET_SECRET, AgentProcess, kill_pid, start_workload, steps, wait_for, wait_steps
from gpusweep_agent.auth import derive_node_key, sign
from gpusweep_agent.client import AgentClientError


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    a = AgentProcess(tmp_path, "gpu-api", tmp_path / "artifacts", reboot_command="simulate",
                     patch_methods=json.dumps({"package": {"simulate": True}})).start()
    yield a
    a.stop()


def test_it_answers_401_to_unauthenticated_stale_or_foreign_requests(agent: AgentProcess) -> None:
    client = agent.client
    assert client.request("GET", "/v1/health", signed=False)[0] == 401
    assert client.request("POST", "/v1/maintenance", {"operation_id": "m1", "enabled": True}, signed=False)[0] == 401
    # The right key but a timestamp ten minutes old: a replayed request.
    old = sign(agent.key, f"{CLUSTER}/gpu-api", "GET", "/v1/health", b"", now=time.time() - 600)
    status, payload = _raw(agent, "GET", "/v1/health", old)
    assert (status, "stale" in payload["error"]) == (401, True)
    # Another node's valid signature is not this node's.
    other_key = derive_node_key(FLEET_SECRET, CLUSTER, "gpu-other")
    status, _ = _raw(agent, "GET", "/v1/health", sign(other_key, f"{CLUSTER}/gpu-other", "GET", "/v1/health", b""))
    assert status == 401
    # A body changed after signing.
    headers = sign(agent.key, f"{CLUSTER}/gpu-api", "POST", "/v1/maintenance", b'{"operation_id":"m2"}')
    status, _ = _raw(agent, "POST", "/v1/maintenance", headers, b'{"operation_id":"m2","enabled":true}')
    assert status == 401
    assert client.get("/v1/health") == {"status": "ok", "node": "test/gpu-api", "agent_version": "0.1.0",
                                        "maintenance": False, "maintenance_holders": {}}
    assert not (agent.state / "maintenance.json").exists(), "a refused call must change nothing"


def test_every_signed_call_sent_again_is_refused_and_changes_nothing(agent: AgentProcess) -> None:
    identity = f"{CLUSTER}/gpu-api"

    def signed(method: str, path: str, body: bytes = b"") -> tuple[str, str, dict[str, str], bytes]:
        return method, path, sign(agent.key, identity, method, path, body), body

    enable = signed("POST", "/v1/maintenance", b'{"operation_id": "m-on", "enabled": true}')
    disable = signed("POST", "/v1/maintenance", b'{"operation_id": "m-off", "enabled": false}')
    reads = [signed("GET", path) for path in ("/v1/health", "/v1/facts", "/v1/workloads", "/v1/operations/m-on")]
    assert _raw(agent, *enable[:3], enable[3])[0] in (200, 202)
    wait_for(lambda: agent.client.get("/v1/operations/m-on")["state"] == "succeeded", 10)
    assert _raw(agent, *disable[:3], disable[3])[0] in (200, 202)
    wait_for(lambda: not agent.client.get("/v1/health")["maintenance"], 10)
    operations = sorted(p.name for p in (agent.state / "operations").iterdir())
    for method, path, headers, body in reads:
        assert _raw(agent, method, path, headers, body)[0] == 200
    for method, path, headers, body in [enable, disable, *reads]:
        status, payload = _raw(agent, method, path, headers, body)
        assert (status, "replayed" in payload["error"]) == (401, True), (method, path, payload)
    assert agent.client.get("/v1/health")["maintenance"] is False  # the replayed "enable" did nothing
    assert sorted(p.name for p in (agent.state / "operations").iterdir()) == operations


def test_it_remembers_the_nonces_across_a_restart(agent: AgentProcess) -> None:
    headers = sign(agent.key, f"{CLUSTER}/gpu-api", "GET", "/v1/facts", b"")
    assert _raw(agent, "GET", "/v1/facts", headers)[0] == 200
    agent.stop()
    agent.start()
    status, payload = _raw(agent, "GET", "/v1/facts", headers)
    assert (status, "replayed" in payload["error"]) == (401, True)


def test_it_refuses_a_request_without_a_nonce(agent: AgentProcess) -> None:
    """A signer older than replay protection (version 1 signature only) is refused: upgrade it."""
    headers = sign(agent.key, f"{CLUSTER}/gpu-api", "GET", "/v1/health", b"")
    legacy = {k: v for k, v in headers.items() if k not in ("X-Gpusweep-Nonce", "X-Gpusweep-Signature-2")}
    status, payload = _raw(agent, "GET", "/v1/health", legacy)
    assert (status, "unsigned nonce" in payload["error"]) == (401, True)


def _raw(agent: AgentProcess, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{agent.port}{path}", data=body or None, method=method,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_it_rejects_malformed_calls_with_400_and_writes_nothing(agent: AgentProcess) -> None:
    status, payload = agent.client.request("POST", "/v1/checkpoint", {"workload_id": "x"})
    assert status == 400 and "operation_id" in payload["error"]
    status, payload = agent.client.request("POST", "/v1/patch", {"operation_id": "p-bad", "component": "driver",
                                                                 "version": "1; rm -rf /", "method": "package"})
    assert status == 400 and "bad version" in payload["error"]
    assert agent.client.request("GET", "/v1/operations/p-bad")[0] == 404
    status, payload = agent.client.request("POST", "/v1/maintenance", {"operation_id": "m-bad", "enabled": "false"})
    assert status == 400 and "true or false" in payload["error"]


def test_it_serves_facts_and_toggles_maintenance(agent: AgentProcess) -> None:
    facts = agent.client.get("/v1/facts")
    assert facts["components"]["driver"] == "570.86.15"
    assert facts["gpu_model"] == "NVIDIA H100 80GB HBM3"
    op = agent.client.call("/v1/maintenance", "maint-on", enabled=True)
    assert op["state"] == "succeeded"
    assert agent.client.get("/v1/health")["maintenance"] is True
    refused = agent.client.call("/v1/restore", "restore-in-maint", checkpoint_id="ck-none")
    assert refused["state"] == "failed" and "maintenance" in refused["error"]
    agent.client.call("/v1/maintenance", "maint-off", enabled=False)
    assert agent.client.get("/v1/health")["maintenance"] is False


def test_it_patches_with_a_dry_run_then_simulated_package_and_reboot(agent: AgentProcess) -> None:
    dry = agent.client.call("/v1/patch", "patch-dry", component="driver", version="580.65.06", method="package",
                            dry_run=True)
    assert dry["state"] == "succeeded"
    assert dry["result"]["command"][-1] == "nvidia-driver-580=580.65.06"
    assert dry["result"]["after"] == "570.86.15" and "dry run" in dry["result"]["output"]

    patched = agent.client.call("/v1/patch", "patch-1", component="driver", version="580.65.06", method="package")
    # What a rollback would put back: the version, and the driver's packages on this machine (none here).
    previous = patched["result"]["previous"]
    assert previous["version"] == "570.86.15" and isinstance(previous["packages"], dict)
    assert patched["result"] | {"output": "", "previous": None} == {
        "before": "570.86.15", "after": "580.65.06", "method": "package", "dry_run": False, "output": "",
        "reboot_required": True, "command": dry["result"]["command"], "previous": None,
    }
    assert agent.client.get("/v1/facts")["components"]["driver"] == "570.86.15", "takes effect at reboot"

    pid = agent.proc.pid if agent.proc else 0
    reboot = agent.client.submit("/v1/reboot", "reboot-1")
    assert reboot["state"] in ("pending", "running")

    def answered() -> dict | None:
        try:
            op = agent.client.get("/v1/operations/reboot-1")
        except AgentClientError:
            return None  # restarting
        return op if op["state"] in ("succeeded", "failed") else None

    done = wait_for(answered, 30, interval=0.1, what="the agent to come back from its simulated reboot")
    assert done["state"] == "succeeded", done
    assert done["result"]["components"]["driver"] == "580.65.06"
    assert agent.client.get("/v1/facts")["components"]["driver"] == "580.65.06"
    assert reboot["id"] == "reboot-1" and agent.proc and agent.proc.pid == pid  # the same process, re-executed
    assert "restarting the agent (simulated reboot)" in agent.log.read_text()


def test_it_runs_a_package_command_from_its_template_and_a_site_script(tmp_path: Path) -> None:
    record = tmp_path / "calls.txt"
    script = tmp_path / "fake-pm"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {record}\necho installed\n")
    script.chmod(0o755)
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'E: Version not found' >&2\nexit 100\n")
    failing.chmod(0o755)
    methods = {"package": {"commands": {"container_toolkit": f"{script} install nvidia-container-toolkit={{version}}"}},
               "script": {"path": str(failing)}}
    a = AgentProcess(tmp_path, "gpu-pm", tmp_path / "artifacts", patch_methods=json.dumps(methods)).start()
    try:
        ok = a.client.call("/v1/patch", "pm-1", component="container_toolkit", version="1.17.4", method="package")
        assert ok["state"] == "succeeded" and "installed" in ok["result"]["output"]
        assert record.read_text() == "install nvidia-container-toolkit=1.17.4\n"
        bad = a.client.call("/v1/patch", "pm-2", component="driver", version="580.65.06", method="script")
        assert bad["state"] == "failed"
        assert "exited 100" in bad["error"] and "Version not found" in bad["error"]
        noop = a.client.call("/v1/patch", "pm-3", component="driver", version="580.65.06", method="noop")
        assert noop["state"] == "succeeded" and noop["result"]["after"] == noop["result"]["before"]
        assert a.client.call("/v1/reboot", "rb-none")["error"].startswith("reboot is not configured")
    finally:
        a.stop()


def test_it_installs_exact_packages_and_fails_a_command_that_installed_other_versions(tmp_path: Path) -> None:
    """The package database is the recording stand-in (no distribution package can be installed here);
    the template's command is real: the agent's recording tool, then one that exits 0 doing nothing."""
    db = tmp_path / "packages.json"
    db.write_text(json.dumps({"installed": {"libssl3": "3.0.2-0ubuntu1.10", "openssl": "3.0.2-0ubuntu1.10"}}))
    install = f"{sys.executable} -m gpusweep_agent.packages --db {db} install {{packages}}"
    fixed = {"libssl3": "3.0.2-0ubuntu1.15", "openssl": "3.0.2-0ubuntu1.15"}
    settings = {"package_manager": "recording", "package_db": str(db)}
    a = AgentProcess(tmp_path, "gpu-ex", tmp_path / "artifacts", **settings,
                     patch_methods=json.dumps({"package": {"commands": {"packages": install}}})).start()
    try:
        ok = a.client.call("/v1/patch", "ex-1", component="packages", version="set-1", method="package",
                           packages=fixed, owner="gs-1-1")
        assert ok["state"] == "succeeded", ok
        assert ok["result"]["packages"] == fixed and ok["result"]["reboot_required"] is False
        assert ok["result"]["command"][-2:] == ["libssl3=3.0.2-0ubuntu1.15", "openssl=3.0.2-0ubuntu1.15"]
        assert ok["result"]["previous"]["packages"] == {"libssl3": "3.0.2-0ubuntu1.10", "openssl": "3.0.2-0ubuntu1.10"}
        assert json.loads(db.read_text())["installed"] == fixed
        refused = a.client.request("POST", "/v1/patch", {"operation_id": "ex-2", "component": "packages",
                                                         "version": "set-2", "method": "package",
                                                         "packages": {"openssl; reboot": "1"}})
        assert refused[0] == 400
    finally:
        a.stop()
    idle = AgentProcess(tmp_path, "gpu-ex2", tmp_path / "artifacts", **settings,
                        patch_methods=json.dumps({"package": {"commands": {"packages": "true {packages}"}}})).start()
    try:
        bad = idle.client.call("/v1/patch", "ex-3", component="packages", version="set-3", method="package",
                               packages={"openssl": "3.0.2-0ubuntu1.16"})
        assert bad["state"] == "failed"
        assert "other versions than the patch asked for" in bad["error"] and "3.0.2-0ubuntu1.16" in bad["error"]
    finally:
        idle.stop()


def test_it_checkpoints_and_restores_with_the_signal_engine(tmp_path: Path) -> None:
    """The application saves its own state on SIGUSR1; agent B starts it again from that state."""
    store = tmp_path / "artifacts"
    a = AgentProcess(tmp_path, "gpu-sa", store).start()
    b = AgentProcess(tmp_path, "gpu-sb", store).start()
    log = tmp_path / "counter.log"
    try:
        proc = start_workload(a, "sig-1", log, megabytes=5, engine="signal")
        wait_steps(log, 10)
        op = a.client.call("/v1/checkpoint", "sig-ck", workload_id="sig-1")
        assert op["state"] == "succeeded", op
        assert proc.wait(15) != 0  # stopped by the agent after acknowledging
        at_checkpoint = steps(log)
        manifest = op["result"]["manifest"]
        assert manifest["engine"] == "signal"
        assert [f["path"] for f in manifest["files"]] == ["state.json"]
        assert manifest["engine_data"]["ack"] == {"step": at_checkpoint[-1]}
        assert "GPUSWEEP_AGENT_KEY" not in manifest["workload"]["env"] and "PATH" in manifest["workload"]["env"]
        assert a.key not in (store / op["result"]["checkpoint_id"] / "manifest.json").read_text()

        restored = b.client.call("/v1/restore", "sig-restore", checkpoint_id=op["result"]["checkpoint_id"])
        assert restored["state"] == "succeeded", restored
        # The step it resumes from, as the application acknowledged it (the campaign report's "steps after").
        assert restored["result"]["steps"] == at_checkpoint[-1]
        try:
            after = wait_steps(log, len(at_checkpoint) + 10)
            assert after == list(range(1, len(after) + 1)), "the counter must continue where it saved itself"
        finally:
            kill_pid(restored["result"]["pid"])
    finally:
        a.stop()
        b.stop()


def test_it_fails_a_signal_checkpoint_the_application_never_acknowledges(tmp_path: Path) -> None:
    a = AgentProcess(tmp_path, "gpu-deaf", tmp_path / "artifacts", signal_timeout="1").start()
    log = tmp_path / "counter.log"
    try:
        # The counter answers SIGUSR1 only; SIGWINCH it ignores, so it never acknowledges.
        proc = start_workload(a, "deaf", log, megabytes=1, engine="signal", signal_name="SIGWINCH")
        wait_steps(log, 3)
        first = a.client.submit("/v1/checkpoint", "deaf-ck", workload_id="deaf")
        second = a.client.call("/v1/checkpoint", "deaf-ck-2", workload_id="deaf")
        assert second["state"] == "failed" and "already being checkpointed" in second["error"]
        op = a.client.wait(first)
        assert op["state"] == "failed"
        assert "did not acknowledge SIGWINCH within 1 s" in op["error"]
        assert op["result"]["workload_state"] == "running"
        assert proc.poll() is None
        assert list((tmp_path / "artifacts").iterdir()) == []
        proc.kill()
    finally:
        a.stop()


def test_it_cold_starts_a_workload_checkpointed_with_the_none_engine(tmp_path: Path) -> None:
    store = tmp_path / "artifacts"
    a = AgentProcess(tmp_path, "gpu-na", store).start()
    log = tmp_path / "counter.log"
    try:
        proc = start_workload(a, "cold-1", log, megabytes=1, engine="none")
        wait_steps(log, 5)
        op = a.client.call("/v1/checkpoint", "cold-ck", workload_id="cold-1")
        assert op["state"] == "succeeded" and op["result"]["manifest"]["files"] == []
        proc.wait(15)
        before = len(steps(log))
        restored = a.client.call("/v1/restore", "cold-restore", checkpoint_id=op["result"]["checkpoint_id"])
        assert restored["result"]["cold_start"] is True
        try:
            after = wait_steps(log, before + 5)
            assert after[before] == 1, "a cold start begins again at step 1"
        finally:
            kill_pid(restored["result"]["pid"])
    finally:
        a.stop()


def test_it_runs_the_configured_reboot_command_and_knows_when_no_reboot_followed(tmp_path: Path) -> None:
    calls = tmp_path / "reboots.txt"
    command = tmp_path / "fake-reboot"
    command.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    command.chmod(0o755)
    a = AgentProcess(tmp_path, "gpu-rb", tmp_path / "artifacts", reboot_command=f"{command} --now").start()
    try:
        op = a.client.submit("/v1/reboot", "rb-1")
        wait_for(calls.exists, 10, what="the reboot command to run")
        assert calls.read_text() == "--now\n"
        assert a.client.get("/v1/operations/rb-1")["state"] == "running", "done only once the node is back"
        # The agent comes back on the same boot: the reboot did not happen, and the operation says so.
        a.stop()
        a.start()
        done = a.client.wait(op, timeout=10)
        assert done["state"] == "failed" and done["error"] == "the agent restarted but the node did not reboot"
        assert a.client.call("/v1/reboot", "rb-1")["state"] == "failed"
        assert calls.read_text() == "--now\n", "a repeated id does not reboot again"
    finally:
        a.stop()


def test_it_applies_a_livepatch_at_once_and_reports_its_version(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The livepatch method runs the livepatch client and reads its state back; no reboot follows.
    canonical-livepatch is a snap service that cannot run here: a stand-in on PATH answers `refresh`
    by recording livepatch 66 and `status --format json` in the client's JSON form."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "lp-version"
    client = bin_dir / "canonical-livepatch"
    client.write_text(
        f'#!/bin/sh\nif [ "$1" = refresh ]; then echo 66 > {state}; echo "Applied 66"; exit 0; fi\n'
        f'v=$(cat {state} 2>/dev/null)\n'
        'if [ -z "$v" ]; then s=nothing-to-apply; else s=applied; fi\n'
        'echo "{\\"status\\": [{\\"running\\": true, \\"livepatch\\": {\\"state\\": \\"$s\\", '
        '\\"version\\": \\"$v.1\\", \\"fixes\\": []}}]}"\n')
    client.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    a = AgentProcess(tmp_path, "gpu-lp", tmp_path / "artifacts", probes="static,livepatch").start()
    try:
        assert "livepatch" not in a.client.get("/v1/facts")["components"]
        done = a.client.call("/v1/patch", "lp-1", component="livepatch", version="66", method="livepatch")
        assert done["state"] == "succeeded", done
        assert done["result"]["after"] == "66" and done["result"]["reboot_required"] is False
        assert "Applied 66" in done["result"]["output"]
        assert a.client.get("/v1/facts")["components"]["livepatch"] == "66"
        wrong = a.client.call("/v1/patch", "lp-2", component="driver", version="580.65.06", method="livepatch")
        assert wrong["state"] == "failed" and "only the livepatch component" in wrong["error"]
    finally:
        a.stop()


def test_it_serves_the_kubelets_checkpoint_archives_and_nothing_else(tmp_path: Path) -> None:
    """Signed GET /v1/kubelet-checkpoints/<name>: a checkpoint-*.tar of kubelet_checkpoint_dir, byte for byte;
    any other name, a path out of the folder or an unsigned call is refused."""
    folder = tmp_path / "kubelet-checkpoints"
    folder.mkdir()
    archive = folder / "checkpoint-trainer_ml-main-2026-12-07T07:20:00Z.tar"
    archive.write_bytes(os.urandom(300_000))
    (folder / "secret.txt").write_text("not an archive")
    (tmp_path / "checkpoint-outside.tar").write_text("outside")
    a = AgentProcess(tmp_path, "gpu-kubelet", tmp_path / "artifacts", kubelet_checkpoint_dir=str(folder)).start()
    try:
        url = "/v1/kubelet-checkpoints/checkpoint-trainer_ml-main-2026-12-07T07%3A20%3A00Z.tar"
        import urllib.request

        request = urllib.request.Request(f"http://127.0.0.1:{a.port}{url}",
                                         headers=sign(a.key, f"{CLUSTER}/gpu-kubelet", "GET", url, b""))
        with urllib.request.urlopen(request, timeout=10) as response:
            assert (response.status, response.read() == archive.read_bytes()) == (200, True)
        for name in ("secret.txt", "..%2Fcheckpoint-outside.tar", "checkpoint-missing.tar"):
            path = f"/v1/kubelet-checkpoints/{name}"
            assert a.client.request("GET", path)[0] == 404, name
        assert a.client.request("GET", url, signed=False)[0] == 401
    finally:
        a.stop()
