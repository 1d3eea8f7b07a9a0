"""A CRIU checkpoint of a workload in one container restored INTO another container (issue 27, item 2):
the replacement pod's container, not beside it.

Real CRIU, real processes, real kernel namespaces and cgroups: each container is built as a runtime builds
one (``containers.py``: its own mount, network, UTS, IPC and PID namespaces, an overlay root mounted on the
host as containerd mounts a rootfs, pivot_root, its own cgroup in every hierarchy). The source runs the
counter as ``gpusweep-run`` runs a pod's command (a child of the container's pid 1); the target's pid 1 is
the placeholder a replacement pod runs (``hold_restored``). The agent is told the target container by its
id, as the pod's status names it (``containerd://<id>``), and finds it through the cgroups. What a user
checks from outside: the restored process's namespaces are the target container's (the inodes of
/proc/<pid>/ns/*), its cgroups are the container's, its root is the container's root (a file only that root
has), and its counter went on without a reset.

It runs twice: with both agents on the node, and with both as the DaemonSet runs them (hostPID, privileged,
``host_exec``/``host_root`` set), each in a mount namespace of its own that lacks the containers' root mounts
and a cgroup namespace of its own where the containers' cgroups are ``/../...`` and its /sys/fs/cgroup is its
own subtree (``containers.agent_container``), both containers in cgroup namespaces of their own as containerd
makes them under cgroup v2. Stand-in there: "the node" is this test's process (``host_root`` names it), not
pid 1, which a sandbox may not let the test reach.

Stand-in: the counter's log is in each container's own root, so the test copies it from the source's root
to the target's between the checkpoint and the restore, as a pod's volume would move with it (CRIU reopens
the file by its path and checks its size).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import containers
import pytest
from agent_helpers import COUNTER, CRIU_HINT, AgentProcess, criu_usable, steps, wait_for, wait_steps

from conftest import need

pytestmark = pytest.mark.criu


@pytest.fixture(params=["agent-on-the-node", "agent-in-a-container"])
def two_containers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        tuple[AgentProcess, AgentProcess, containers.Container, containers.Container, str]]:
    """Two agents, a source container running the counter and a target container holding the placeholder.
    ``agent-in-a-container``: both agents run as the DaemonSet's container runs one (``containers.agent_container``:
    their own mount and cgroup namespaces, their own cgroup subtree mounted, hostPID), with ``host_exec`` and
    ``host_root`` naming this test's process as the node (the sandbox's pid 1 may not be reachable), and both
    containers in cgroup namespaces of their own, as containerd makes them under cgroup v2.
    """
    need(criu_usable() and shutil.which("unshare") is not None, CRIU_HINT + " (and util-linux's unshare)")
    in_container = request.param == "agent-in-a-container"
    store = tmp_path / "artifacts"
    wrap_a, cgroups_a = containers.agent_container(tmp_path, "gpu-a") if in_container else ([], [])
    wrap_b, cgroups_b = containers.agent_container(tmp_path, "gpu-b") if in_container else ([], [])
    settings = {"host_exec": f"nsenter -t {os.getpid()} -m -u -i -n -p --",
                "host_root": f"/proc/{os.getpid()}/root"} if in_container else {}
    agent_a = AgentProcess(tmp_path, "gpu-a", store, wrap=wrap_a, **settings).start()
    agent_b = AgentProcess(tmp_path, "gpu-b", store, wrap=wrap_b, **settings)
    started: list[containers.Container] = []
    target_id = uuid.uuid4().hex + uuid.uuid4().hex
    try:
        agent_b.start()
        # Containers start after the agents: their root mounts are not in a containerized agent's mount table.
        started.append(containers.start(tmp_path / "ctr-a", "a", "workload",
                                        [sys.executable, str(COUNTER), "/counter.log", "1"],
                                        cgroup_namespace=in_container))
        # The placeholder waits 4 s for the restore; it must stay while the restored workload runs.
        started.append(containers.start(tmp_path / "ctr-b", "b", "placeholder", ["4"],
                                        cgroup_name=f"cri-containerd-{target_id}.scope",
                                        cgroup_namespace=in_container))
        yield agent_a, agent_b, started[0], started[1], target_id
    finally:
        for container in started:
            container.stop()
        agent_a.stop()
        agent_b.stop()
        containers.remove_cgroups(cgroups_a + cgroups_b)


def namespaces(pid: int) -> dict[str, int]:
    return {kind: os.stat(f"/proc/{pid}/ns/{kind}").st_ino for kind in ("mnt", "net", "uts", "ipc", "pid", "cgroup")}


def test_a_checkpoint_of_a_containers_workload_is_restored_into_the_replacement_container(two_containers) -> None:
    agent_a, agent_b, source, target, target_id = two_containers
    target_started = time.time()
    assert agent_b.proc is not None
    if agent_b.wrap:
        # The agent is in a container: the target's root mount is not in its mount table, and it sees the
        # target's cgroups relative to its own cgroup namespace (what an agent on the node would not).
        agent_ns, node_ns = namespaces(agent_b.proc.pid), namespaces(os.getpid())
        assert agent_ns["mnt"] != node_ns["mnt"] and agent_ns["cgroup"] != node_ns["cgroup"]
        assert str(target.merged) not in Path(f"/proc/{agent_b.proc.pid}/mountinfo").read_text()
        seen = subprocess.run(["nsenter", "-t", str(agent_b.proc.pid), "-C", "cat", f"/proc/{target.pid}/cgroup"],
                              capture_output=True, text=True, check=True).stdout
        assert "/../" in seen, seen
        assert namespaces(target.pid)["cgroup"] not in (agent_ns["cgroup"], node_ns["cgroup"])
    counter = wait_for(source.children, 10, what="the counter in the source container")[0]
    log_a, log_b = source.folder / "upper" / "counter.log", target.folder / "upper" / "counter.log"
    wait_steps(log_a, 10)
    registered = agent_a.client.call("/v1/workloads", "reg-ctr", workload_id="ml.trainer", pid=counter,
                                     name="counter", checkpoint_engine="criu", command=["counter"], cwd="/")
    assert registered["state"] == "succeeded", registered

    taken = agent_a.client.call("/v1/checkpoint", "ck-ctr", workload_id="ml.trainer")
    assert taken["state"] == "succeeded", f"{taken}"
    # What the restore needs is in the image's record: the pod's network and the container's PID namespace.
    container = taken["result"]["manifest"]["engine_data"]["container"]
    assert {"net", "pid", "mnt"} <= set(container) and not container.get("pid_init"), container
    at_checkpoint = steps(log_a)
    shutil.copy2(log_a, log_b)  # the pod's volume, moved with it (see the module docstring)

    restored = agent_b.client.call("/v1/restore", "rs-ctr", checkpoint_id=taken["result"]["checkpoint_id"],
                                   container_id=f"containerd://{target_id}")
    assert restored["state"] == "succeeded", f"{restored}"
    pid = int(restored["result"]["pid"])
    assert restored["result"]["container_pid"] == target.pid
    # Into the container's own PID namespace, under the pid it had (the placeholder is pid 1 there).
    assert restored["result"]["pid_in_container"] == 2
    inside, placeholder = namespaces(pid), namespaces(target.pid)
    joined = ("net", "uts", "ipc", "pid", "cgroup") if agent_b.wrap else ("net", "uts", "ipc", "pid")
    assert {k: inside[k] for k in joined} == {k: placeholder[k] for k in joined}, \
        "not in the replacement container's namespaces"
    assert inside["mnt"] != namespaces(os.getpid())["mnt"]
    assert Path(f"/proc/{pid}/cgroup").read_text() == Path(f"/proc/{target.pid}/cgroup").read_text()
    assert f"cri-containerd-{target_id}.scope" in Path(f"/proc/{pid}/cgroup").read_text()
    # Its root is the replacement container's root: the file only that root has, and not the source's.
    assert Path(f"/proc/{pid}/root/only-in-b").read_text() == "b"
    assert not Path(f"/proc/{pid}/root/only-in-a").exists()
    after = wait_steps(log_b, len(at_checkpoint) + 10)
    assert after == list(range(1, len(after) + 1)), "the counter reset, skipped or repeated a step"
    assert not log_a.exists() or steps(log_a) == at_checkpoint, "the source kept counting"
    # The replacement container stays up while its restored workload runs (past the placeholder's 4 s wait)...
    wait_for(lambda: os.stat(log_b).st_mtime > target_started + 6, 15, what="the counter past 6 s")
    assert target.proc.poll() is None, "the replacement container ended under its workload"
    # ...and ends when its workload ends, as a pod's container does.
    os.kill(pid, 9)
    wait_for(lambda: target.proc.poll() is not None, 10, what="the replacement container to end")
