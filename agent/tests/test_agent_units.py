"""Agent pieces on their own: probes' parsing, configuration, heartbeats, discovery."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import DATA, AgentProcess, start_workload, wait_for, wait_steps
from gpusweep_agent.agent import PR_SET_CHILD_SUBREAPER, Agent
from gpusweep_agent.artifacts import GrowingFileHasher, LocalArtifactStore
from gpusweep_agent.auth import AuthError, derive_node_key, verify
from gpusweep_agent.config import ConfigError, load_config
from gpusweep_agent.engines import EngineUnavailable, get_engine
from gpusweep_agent.engines.criu import (
    DUMP_OK,
    CriuEngine,
    has_tcp_connections,
    stopped,
)
from gpusweep_agent.engines.signal import SignalEngine
from gpusweep_agent.facts import KernelProbe, PackagesProbe, gather, parse_dpkg_query, parse_nvidia_smi
from gpusweep_agent.heartbeat import (
    HeartbeatAuthError,
    HeartbeatRejected,
    HeartbeatSender,
    HeartbeatUnavailable,
)
from gpusweep_agent.operations import OperationError
from gpusweep_agent.patch import PackagePatch, PatchError
from gpusweep_agent.workloads import discover_cgroup_workloads

from conftest import need


def test_it_parses_nvidia_smi_output() -> None:
    """Parsed from output in the format nvidia-smi 570 prints (data/), as no GPU is here."""
    facts = parse_nvidia_smi((DATA / "nvidia-smi-query.csv").read_text(), (DATA / "nvidia-smi.txt").read_text())
    assert facts == {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 4, "product_line": "tesla",
                     "components": {"driver": "570.86.15", "cuda": "12.8"}}
    assert parse_nvidia_smi("", "") == {"components": {}}


def test_it_reads_component_versions_from_dpkg() -> None:
    sample = ("nvidia-container-toolkit\t1.17.4-1\tinstalled\n"
              "datacenter-gpu-manager\t1:3.3.9\tinstalled\n"
              "nvidia-fabricmanager-570\t570.86.15-1\tinstalled\n"
              "nvidia-container-toolkit-base\t1.17.4-1\tinstalled\n"
              "datacenter-gpu-manager-old\t1:2.0\tconfig-files\n")
    assert parse_dpkg_query(sample) == {"container_toolkit": "1.17.4", "dcgm": "3.3.9", "fabric_manager": "570.86.15"}


def test_it_probes_this_machines_kernel_and_packages(tmp_path: Path) -> None:
    need(shutil.which("dpkg-query") is not None, "needs a Debian-family system with dpkg-query")
    config = load_config(environ={"GPUSWEEP_AGENT_KEY": "k", "GPUSWEEP_AGENT_STATE_DIR": str(tmp_path)})
    kernel = KernelProbe(config).probe()
    assert kernel["components"]["kernel"] == subprocess.run(["uname", "-r"], capture_output=True,
                                                            text=True, check=True).stdout.strip()
    assert kernel["components"]["os"].startswith("debian")
    assert isinstance(PackagesProbe(config).probe().get("components", {}), dict)


def test_it_layers_file_environment_and_flags_with_a_static_facts_file_last(tmp_path: Path) -> None:
    import argparse

    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"gpu_model": "NVIDIA A100", "components": {"driver": "535.230.02"}}))
    conf = tmp_path / "agent.json"
    conf.write_text(json.dumps({"node": "from-file", "port": 1, "probes": ["kernel"], "static_facts": str(facts)}))
    key_file = tmp_path / "key"
    key_file.write_text("secret-key\n")
    env = {"GPUSWEEP_AGENT_CONFIG": str(conf), "GPUSWEEP_AGENT_PORT": "2", "GPUSWEEP_AGENT_KEY_FILE": str(key_file)}
    config = load_config(argparse.Namespace(port="3", config=None), environ=env)
    assert (config.node, config.port, config.key, config.identity) == ("from-file", 3, "secret-key", "local/from-file")
    assert config.artifact_dir == config.state_dir / "artifacts"
    merged = gather(config)
    assert merged["gpu_model"] == "NVIDIA A100"
    assert merged["components"]["driver"] == "535.230.02" and "kernel" in merged["components"]

    conf.write_text(json.dumps({"key": "never-in-a-file"}))
    with pytest.raises(ConfigError, match="forbidden"):
        load_config(environ=env)
    with pytest.raises(ConfigError, match="no node key"):
        load_config(environ={})
    with pytest.raises(ConfigError, match="'port': bad value"):
        load_config(environ={"GPUSWEEP_AGENT_KEY": "k", "GPUSWEEP_AGENT_PORT": "eighty"})


def test_it_loads_engines_by_name_or_dotted_path(tmp_path: Path) -> None:
    config = load_config(environ={"GPUSWEEP_AGENT_KEY": "k", "GPUSWEEP_AGENT_STATE_DIR": str(tmp_path),
                                  "GPUSWEEP_AGENT_ENGINES": '{"app": "gpusweep_agent.engines.signal.SignalEngine"}'})
    assert isinstance(get_engine("signal", config), SignalEngine)
    assert isinstance(get_engine("app", config), SignalEngine)
    with pytest.raises(EngineUnavailable, match="unknown checkpoint engine 'tape'"):
        get_engine("tape", config)


def test_it_splits_a_package_template_before_filling_in_values(tmp_path: Path) -> None:
    config = load_config(environ={"GPUSWEEP_AGENT_KEY": "k"})
    method = PackagePatch(config, {"command": "dnf install -y 'nvidia-driver-{branch}' --setopt=x={version}"})
    assert method.command("fabric_manager", "570.86.15") == [
        "dnf", "install", "-y", "nvidia-driver-570", "--setopt=x=570.86.15"]
    with pytest.raises(PatchError, match="no command template"):
        PackagePatch(config, {}).command("firmware", "1.0")


DRIVER_FIX = {"nvidia-driver-570-server": "570.172.08-0ubuntu0.22.04.1",
              "libnvidia-compute-570-server": "570.172.08-0ubuntu0.22.04.1"}


def test_exact_packages_are_one_word_each_in_the_package_managers_own_spelling(tmp_path: Path) -> None:
    """A distribution's fix installs every named binary at its exact version: apt's name=version on a
    dpkg node, dnf's name-version on an rpm node; a site overrides the template and the spelling."""
    dpkg = load_config(environ={"GPUSWEEP_AGENT_KEY": "k", "GPUSWEEP_AGENT_PACKAGE_MANAGER": "dpkg"})
    assert PackagePatch(dpkg, {}).command("driver", "570.172.08", DRIVER_FIX) == [
        "apt-get", "install", "-y", "--no-install-recommends",
        "libnvidia-compute-570-server=570.172.08-0ubuntu0.22.04.1",
        "nvidia-driver-570-server=570.172.08-0ubuntu0.22.04.1"]
    rpm = load_config(environ={"GPUSWEEP_AGENT_KEY": "k", "GPUSWEEP_AGENT_PACKAGE_MANAGER": "rpm"})
    assert PackagePatch(rpm, {}).command("packages", "set-1", {"openssl-libs": "1:3.0.7-27.el9"}) == [
        "dnf", "install", "-y", "openssl-libs-1:3.0.7-27.el9"]
    site = PackagePatch(dpkg, {"commands": {"packages": "/site/upgrade --component {component} {packages} --yes"},
                               "package_format": "{name}/{version}"})
    assert site.command("driver", "570.172.08", {"nvidia-driver-570-server": "570.172.08-0ubuntu0.22.04.1"}) == [
        "/site/upgrade", "--component", "driver", "nvidia-driver-570-server/570.172.08-0ubuntu0.22.04.1", "--yes"]
    # Without exact packages the component's own template is unchanged.
    assert PackagePatch(dpkg, {}).command("driver", "570.172.08")[-1] == "nvidia-driver-570=570.172.08"


def test_a_patch_request_with_bad_packages_is_refused() -> None:
    from gpusweep_agent.patch import validate

    validate("driver", "570.172.08", DRIVER_FIX)
    for bad in ({"nvidia-driver-570 --allow-unauthenticated": "1"}, {"ok": "1 2"}, {"ok": "$(reboot)"},
                ["nvidia-driver-570=1"], {"": "1"}):
        with pytest.raises(PatchError, match="packages"):
            validate("driver", "570.172.08", bad)


def test_it_finds_slurm_steps_and_kubernetes_pods_by_cgroup(tmp_path: Path) -> None:
    """A /proc tree built in tmp_path: this machine runs no slurmstepd cgroups and no kubelet."""
    layout = {
        "101": "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
        "102": "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_1\n",
        "103": "0::/system.slice/slurmstepd.scope/job_42/step_batch/user/task_0\n",
        "201": "0::/kubepods.slice/kubepods-burstable.slice/"
               "kubepods-burstable-pod0f6c2a1e_5a3b_4c2d_9e8f_112233445566.slice/cri-containerd-abc.scope\n",
        "301": "0::/user.slice/user-0.slice/session-1.scope\n",
        "self": "0::/\n",
    }
    for pid, cgroup in layout.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cgroup").write_text(cgroup)
    found = {w["id"]: w for w in discover_cgroup_workloads(tmp_path)}
    assert sorted(found) == ["pod-0f6c2a1e-5a3b-4c2d-9e8f-112233445566", "slurm-42.0", "slurm-42.batch"]
    assert found["slurm-42.0"]["pids"] == [101, 102] and found["slurm-42.0"]["kind"] == "slurm_step"
    assert found["pod-0f6c2a1e-5a3b-4c2d-9e8f-112233445566"]["kind"] == "k8s_pod"


def test_on_a_host_with_several_slurmd_it_finds_the_steps_of_its_own_node_only(tmp_path: Path) -> None:
    """One host running a slurmd per node (multiple-slurmd, as tests/slurm_cluster.py does) names the node in
    each step's cgroup; gpu01's agent lists gpu01's steps and those under a cgroup naming no node (a host's
    one slurmd), never gpu02's. A /proc tree built in tmp_path: the test cluster tracks jobs by process."""
    layout = {
        "101": "4:memory:/slurm_gpu01/uid_0/job_7/step_batch\n1:pids:/slurm_gpu01/uid_0/job_7/step_batch\n0::/\n",
        "102": "4:memory:/slurm_gpu02/uid_0/job_8/step_batch\n0::/\n",
        "103": "0::/system.slice/gpu01_slurmstepd.scope/job_9/step_0/user/task_0\n",
        "104": "0::/system.slice/gpu02_slurmstepd.scope/job_10/step_0/user/task_0\n",
        "105": "0::/system.slice/slurmstepd.scope/job_11/step_batch/user/task_0\n",
        "106": "4:memory:/slurm/uid_0/job_12/step_extern\n0::/\n",
    }
    for pid, cgroup in layout.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cgroup").write_text(cgroup)
    mine = ["slurm-11.batch", "slurm-12.extern", "slurm-7.batch", "slurm-9.0"]
    assert [w["id"] for w in discover_cgroup_workloads(tmp_path, node="gpu01")] == mine
    assert [w["id"] for w in discover_cgroup_workloads(tmp_path, node="gpu02")] == [
        "slurm-10.0", "slurm-11.batch", "slurm-12.extern", "slurm-8.batch"]
    # An agent that knows no node name lists every step on the host.
    assert len(discover_cgroup_workloads(tmp_path)) == len(layout)


class Receiver(BaseHTTPRequestHandler):
    """Stands in for the service's heartbeat receiver (another engineer's inventory app), checking
    signatures with the same auth module; `status` and the received bodies are set per test."""

    status = 200
    received: list[dict[str, Any]] = []
    key = derive_node_key("fleet", "local", "gpu01")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            verify(self.key, dict(self.headers.items()), "POST", self.path, body)
            status = self.status
        except AuthError:
            status = 401
        type(self).received.append(json.loads(body))
        payload = json.dumps({"node_id": 1, "changed": [], "next_heartbeat_s": 7} if status == 200
                             else {"errors": {"facts": ["bad"]}}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.received = []
    Receiver.status = 200
    Receiver.key = derive_node_key("fleet", "local", "gpu01")
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def sender(url: str, key: str | None = None) -> HeartbeatSender:
    return HeartbeatSender(url, "local", "gpu01", key or derive_node_key("fleet", "local", "gpu01"),
                           "http://10.0.0.5:17100", facts=lambda: {"gpu_model": "X", "components": {}},
                           workloads=lambda: [{"id": "w", "pid": 1, "state": "running", "name": "trainer"},
                                              {"id": "moved", "pid": 2, "state": "checkpointed", "name": "gone"}],
                           interval=30, max_backoff=300, rng=random.Random(1))


def test_it_sends_signed_heartbeats_in_the_wire_format(receiver: str) -> None:
    answer = sender(receiver).send()
    assert answer["next_heartbeat_s"] == 7
    body = Receiver.received[0]
    assert body["schema"] == "gpusweep.heartbeat/1" and (body["cluster"], body["node"]) == ("local", "gpu01")
    # The checkpointed (migrated) workload runs elsewhere now: it is not reported from here.
    assert body["workloads"] == [{"name": "trainer"}] and body["endpoint"] == "http://10.0.0.5:17100"


def test_it_raises_typed_heartbeat_errors_and_backs_off(receiver: str) -> None:
    Receiver.status = 400
    with pytest.raises(HeartbeatRejected) as rejected:
        sender(receiver).send()
    assert rejected.value.errors == {"facts": ["bad"]}
    Receiver.status = 200
    with pytest.raises(HeartbeatAuthError):
        sender(receiver, key="wrong").send()
    with pytest.raises(HeartbeatUnavailable):
        sender("http://127.0.0.1:9").send()

    s = sender(receiver)
    delays = [s.next_delay(None) for _ in range(12)]
    assert all(0.5 * min(300, 2 ** n) <= d <= min(300, 2 ** n) for n, d in enumerate(delays, start=1))
    assert delays[-1] >= 150, "the backoff reaches its ceiling"
    assert 27 <= s.next_delay({}) <= 33 and s.failures == 0
    assert 6.3 <= s.next_delay({"next_heartbeat_s": 7}) <= 7.7


def test_it_heartbeats_from_a_running_agent_with_its_facts_and_workloads(receiver: str, tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "gpu-hb", tmp_path / "artifacts", service_url=receiver, heartbeat_interval="0.5")
    Receiver.key = agent.key
    agent.start()
    log = tmp_path / "counter.log"
    try:
        proc = start_workload(agent, "hb-1", log, megabytes=1)
        wait_steps(log, 2)
        # Its own workload by name: the host's other processes (a Slurm job of another test on this
        # machine, say) may be listed beside it.
        def listing() -> tuple[dict, dict] | None:
            return next(((b, w) for b in Receiver.received for w in b["workloads"] if w["scheduler_id"] == "hb-1"),
                        None)

        beat, workload = wait_for(listing, 20, what="a heartbeat that lists the workload")
        assert (beat["cluster"], beat["node"]) == ("test", "gpu-hb")
        assert beat["facts"]["components"]["driver"] == "570.86.15"
        assert workload["checkpoint_engine"] == "criu"
        proc.kill()
    finally:
        agent.stop()


def test_it_hashes_page_images_while_they_are_written(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    folder = store.image_dir("ck-grow")
    folder.mkdir()
    blocks = [bytes([n]) * 1_000_003 for n in range(20)]
    with GrowingFileHasher(folder, chunk=65536) as hasher:
        with (folder / "pages-1.img").open("wb") as fh:
            for block in blocks:
                fh.write(block)
                fh.flush()
                time.sleep(0.005)
        # A file replaced by another (a new inode) is hashed again, not trusted.
        (folder / "pages-2.img").write_bytes(b"old")
        time.sleep(0.05)
        (folder / "pages-2.img.tmp").write_bytes(b"new content")
        (folder / "pages-2.img.tmp").rename(folder / "pages-2.img")
    (folder / "core-1.img").write_bytes(b"core")
    manifest = store.build_manifest("ck-grow", {"id": "w"}, "criu", {}, {}, hasher.digests())
    expected = {"pages-1.img": hashlib.sha256(b"".join(blocks)).hexdigest(),
                "pages-2.img": hashlib.sha256(b"new content").hexdigest(),
                "core-1.img": hashlib.sha256(b"core").hexdigest()}
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == expected
    assert hasher.digests()["pages-1.img"][1] == 20 * 1_000_003
    store.write_manifest("ck-grow", manifest)
    assert store.verify("ck-grow")["total_bytes"] == 20 * 1_000_003 + len(b"new content") + 4


def test_a_folder_vanishing_while_it_is_listed_does_not_end_the_hashing(tmp_path: Path) -> None:
    """A failed pre-dump's round folders are removed while the hasher lists the image folder (the
    plain dump follows); the listing's FileNotFoundError once ended the hasher's thread, and every page
    image written after it went unhashed until the manifest. Here the folder's listing fails the way
    a removal under os.scandir makes it fail (a stand-in for the race, which is rare)."""
    fails = [1, 1]

    class VanishingFolder(type(tmp_path)):  # type: ignore[misc]
        def glob(self, pattern: str, *args: Any, **kwargs: Any) -> Any:
            if fails:
                fails.pop()
                raise FileNotFoundError(2, "No such file or directory", str(self / "pre-1"))
            return super().glob(pattern, *args, **kwargs)

    folder = VanishingFolder(tmp_path / "ck-vanish")
    folder.mkdir()
    with GrowingFileHasher(folder) as hasher:
        time.sleep(0.1)  # both failed listings happen here
        (folder / "pages-1.img").write_bytes(b"after the removal")
    assert not fails
    assert hasher.digests()["pages-1.img"][2] == hashlib.sha256(b"after the removal").hexdigest()


TCP_CHILD = """
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
if sys.argv[1] == "connect":
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("command,connected", [
    ("python3 {script} listen", False),
    ("python3 {script} connect", True),
    ("unshare -n sh -c 'ip link set lo up && python3 {script} connect'", True),
], ids=["listening", "connected", "connected-in-its-own-network-namespace"])
def test_it_asks_criu_for_tcp_established_only_when_a_connection_is_open(
    tmp_path: Path, command: str, connected: bool
) -> None:
    """Real sockets held by a child of the workload's shell (in one case in a network namespace of its own)."""
    if command.startswith("unshare"):
        need(os.geteuid() == 0, "a network namespace needs root: run the tests as root")
    script = tmp_path / "tcp_child.py"
    script.write_text(TCP_CHILD)
    proc = subprocess.Popen(["sh", "-c", command.format(script=script) + "; exit 0"], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert has_tcp_connections(proc.pid) is connected
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("leave_running", [False, True])
def test_it_kills_a_process_criu_left_stopped_when_the_agent_died_before_killing_it(
    tmp_path: Path, leave_running: bool
) -> None:
    """CRIU itself is not run: a real stopped process and the log line of a finished dump stand in
    for the moment after `criu dump --leave-stopped` returned and before the agent's kill."""
    config = load_config(environ={"GPUSWEEP_AGENT_NODE": "n", "GPUSWEEP_AGENT_KEY": "k" * 32,
                                  "GPUSWEEP_AGENT_STATE_DIR": str(tmp_path / "state")})
    engine = CriuEngine(config)
    image_dir = tmp_path / "ck-1"
    log = engine.log_path(image_dir, "dump")
    log.write_text(f"(00.1) {DUMP_OK}\n")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(proc.pid), 5, what="the process to stop")
        state = {"log": str(log), "leave_running": leave_running}
        assert engine.recover({"id": "w", "pid": proc.pid}, image_dir, state) is True
        if leave_running:
            assert proc.poll() is None
        else:
            assert proc.wait(5) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_it_fails_a_checkpoint_whose_images_cannot_reach_stable_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk error on fsync in the artifact store is simulated (EIO cannot be provoked on this machine's disk)."""
    config = load_config(environ={"GPUSWEEP_AGENT_NODE": "n", "GPUSWEEP_AGENT_KEY": "k" * 32,
                                  "GPUSWEEP_AGENT_STATE_DIR": str(tmp_path / "state")})
    agent = Agent(config)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)  # Agent() made this test process a subreaper
    image_dir = agent.artifacts.image_dir("ck-eio")
    image_dir.mkdir(parents=True)
    (image_dir / "pages-1.img").write_bytes(b"x" * 4096)
    agent.artifacts.make_durable("ck-eio")  # a working disk: no error

    fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(image_dir)):
            raise OSError(errno.EIO, "Input/output error")
        fsync(fd)  # the agent's own state folder is on a working disk

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OperationError) as raised:
        agent._make_durable("ck-eio", {"id": "w", "pid": 0})
    assert "could not be written to stable storage" in str(raised.value)
    assert str(image_dir) in str(raised.value)
    assert raised.value.result == {"workload_state": "exited", "checkpoint_id": "ck-eio"}
    assert not (image_dir / "manifest.json").exists()

    # The same after an agent restart that finds CRIU's dump finished: failed, images kept, nothing sealed.
    engine = CriuEngine(config)
    log = engine.log_path(image_dir, "dump")
    log.write_text(f"(00.1) {DUMP_OK}\n")
    agent.operations.create("ck-op", "checkpoint", {"workload_id": "w"})
    agent.operations.update("ck-op", state="running", progress={
        "checkpoint_id": "ck-eio", "engine": "criu", "workload": {"id": "w", "pid": 0}, "log": str(log)})
    agent._recover_checkpoint(agent.operations.get("ck-op") or {})
    recovered = agent.operations.get("ck-op") or {}
    assert recovered["state"] == "failed" and "stable storage" in recovered["error"]
    assert (image_dir / "pages-1.img").is_file() and not (image_dir / "manifest.json").exists()


def test_the_checkpoint_tools_versions_are_facts(tmp_path, monkeypatch):
    """Issue 26, item 5: the agent reports CRIU's version (and cuda-checkpoint's where installed), so the
    portability rule compares real versions instead of "" with ""."""
    from gpusweep_agent.config import AgentConfig
    from gpusweep_agent.facts import CheckpointToolsProbe, tool_version

    fake = tmp_path / "criu"
    fake.write_text("#!/bin/sh\necho 'Version: 4.1.1'\necho 'GitID: v4.1.1'\n")
    fake.chmod(0o755)
    tool = tmp_path / "cuda-checkpoint"
    tool.write_text("#!/bin/sh\necho 'cuda-checkpoint version 580.65.06' >&2\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    facts = CheckpointToolsProbe(AgentConfig(criu=str(fake))).probe()
    assert facts == {"components": {"criu": "4.1.1", "cuda_checkpoint": "580.65.06"}}
    assert tool_version("no-such-tool-here") == ""
    tool.unlink()
    assert CheckpointToolsProbe(AgentConfig(criu=str(fake))).probe() == {"components": {"criu": "4.1.1"}}


def test_a_lazy_source_decides_once_and_refuses_a_reboot_until_then(tmp_path: Path) -> None:
    """The two-phase release's decision (agent.py, lazy moves) on a real stopped process, as CRIU's
    --leave-stopped leaves it: the receiver's first final word stands, later reports get the same answer,
    and the node refuses a reboot while the decision is open."""
    from gpusweep_agent.engines import lazy
    from gpusweep_agent.engines.criu import stopped

    config = load_config(environ={"GPUSWEEP_AGENT_NODE": "n", "GPUSWEEP_AGENT_KEY": "k" * 32,
                                  "GPUSWEEP_AGENT_STATE_DIR": str(tmp_path / "state"),
                                  "GPUSWEEP_AGENT_REBOOT_COMMAND": "true",
                                  "GPUSWEEP_AGENT_LAZY_RELEASE_TIMEOUT_S": "0.5"})
    agent = Agent(config)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(proc.pid), 5, what="the copy to stop")
        agent._write_lazy("ck-lazy", "source", {"state": "awaiting_receiver", "pid": proc.pid,
                                                "pid_started": lazy.start_time(proc.pid), "workload_id": "w"})
        agent.operations.create("rb", "reboot", {})
        started = time.monotonic()
        with pytest.raises(OperationError, match="ck-lazy"):
            agent.run_reboot({"id": "rb", "params": {}})
        # It waited for the move to settle (4 x the release timeout) before refusing, and said why.
        assert time.monotonic() - started >= 2.0
        assert agent.operations.get("rb")["progress"]["waiting_for_lazy_moves"] == ["ck-lazy"]
        with pytest.raises(LookupError):
            agent.lazy_report("ck-other", "complete", "b")
        with pytest.raises(ValueError):
            agent.lazy_report("ck-lazy", "done", "b")
        assert agent.lazy_report("ck-lazy", "failed", "b")["decision"] == "resumed"
        assert not stopped(proc.pid) and proc.poll() is None  # thawed, running on
        # A later "complete" (a retry, a confused receiver) changes nothing: the copy is not killed.
        assert agent.lazy_report("ck-lazy", "complete", "b") == {"decision": "resumed", "state": "failed"}
        assert proc.poll() is None
        source = agent.lazy_status("ck-lazy")["source"]  # type: ignore[index]
        assert source["receiver_report"] == "failed" and source["resumed_on_source"] is True
        assert agent.unsettled_lazy_sources() == []
    finally:
        proc.kill()
        proc.wait()
