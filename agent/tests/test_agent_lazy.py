"""Lazy moves through real agents and real CRIU (engines/lazy.py): the receiver resumes the workload
before its memory arrives, the pages stream from the source's CRIU page server, and the source's frozen
copy goes only once the receiver reports every page in the restored process (the two-phase release); a
stream cut at any moment leaves the workload alive on exactly one side, its progress continuing.

Both agents run on this one host, so the workload runs in a PID namespace of its own (`unshare --pid`):
the source's frozen copy and the restored one exist at once for as long as the pages stream, and CRIU
restores a process under its own pid (on two nodes no namespace is needed). The images travel between
two stores through the agents' share and fetch, hash-checked, as between two nodes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import COUNTER, CRIU_HINT, AgentProcess, criu_usable, kill_pid, steps, wait_for, wait_steps
from gpusweep_agent.engines import lazy
from gpusweep_agent.engines.criu import processes_mentioning, stopped
from gpusweep_agent.engines.lazy import lazy_pages_missing
from gpusweep_agent.transfer import image_digest
from gpusweep_agent.util import pid_alive

from conftest import need

pytestmark = pytest.mark.criu


def lazy_agents(tmp_path: Path, **settings: str) -> tuple[AgentProcess, AgentProcess]:
    """Two agents with their own stores (settings: agent settings, e.g. lazy_release_timeout_s)."""
    need(criu_usable(), CRIU_HINT)
    missing = lazy_pages_missing("criu")
    need(not missing, f"lazy pages: {missing} (scripts/build-criu.sh sets it)")
    return (AgentProcess(tmp_path, "lazy-a", tmp_path / "store-a", **settings).start(),
            AgentProcess(tmp_path, "lazy-b", tmp_path / "store-b", **settings).start())


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    a, b = lazy_agents(tmp_path)
    yield a, b
    a.stop()
    b.stop()


def start_in_pid_namespace(log: Path, megabytes: int) -> tuple[subprocess.Popen[bytes], int]:
    """The counter as the first process of a new PID namespace (and its own session); its pid here."""
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "setsid", sys.executable, str(COUNTER), str(log),
                             str(megabytes)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    pid = int(wait_for(lambda: children.read_text().split(), 10, what="the counter in its namespace")[0])
    return proc, pid


def move_lazily(a: AgentProcess, b: AgentProcess, workload: str, pid: int) -> tuple[dict[str, Any], int]:
    """Register, checkpoint lazily on a, fetch the images to b (hash-checked), restore there; (manifest, new pid)."""
    assert a.client.call("/v1/workloads", f"reg-{workload}", workload_id=workload, pid=pid)["state"] == "succeeded"
    op = a.client.call("/v1/checkpoint", f"ck-{workload}", workload_id=workload, lazy_pages=True)
    assert op["state"] == "succeeded", op
    manifest = op["result"]["manifest"]
    checkpoint_id = op["result"]["checkpoint_id"]
    share = a.client.call("/v1/share", f"share-{workload}", checkpoint_id=checkpoint_id, to=b.node)
    fetched = b.client.call("/v1/fetch", f"fetch-{workload}", checkpoint_id=checkpoint_id,
                            source=f"http://127.0.0.1:{a.port}", token=share["result"]["token"],
                            sha256=image_digest(manifest))
    assert fetched["state"] == "succeeded", fetched
    restored = b.client.call("/v1/restore", f"rs-{workload}", checkpoint_id=checkpoint_id)
    assert restored["state"] == "succeeded", restored
    return manifest, int(restored["result"]["pid"])


def stream_ended(helper: int) -> bool:
    """Whether a stopped lazy helper (the source's dump or the receiver's daemon) had already moved every
    page, read from the log it names after -o; a helper already gone has ended."""
    try:
        argv = Path(f"/proc/{helper}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    text = Path(argv[argv.index(b"-o") + 1].decode()).read_text(errors="replace")
    return lazy.SERVED in text or (lazy.TRANSFERRED_RE.search(text) is not None)


def lazy_side(agent: AgentProcess, checkpoint_id: str, side: str) -> dict[str, Any]:
    return dict((agent.client.get(f"/v1/checkpoints/{checkpoint_id}").get("lazy") or {}).get(side) or {})


def test_it_moves_a_counter_lazily_and_releases_the_source_only_after_every_page_arrived(agents, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = agents
    log = tmp_path / "counter.log"
    proc, pid = start_in_pid_namespace(log, megabytes=64)
    new_pid = 0
    try:
        wait_steps(log, 20)
        manifest, new_pid = move_lazily(a, b, "lazy-counter", pid)
        checkpoint_id = manifest["checkpoint_id"]
        dump = manifest["engine_data"]["dump"]
        assert dump["mode"] == "lazy" and dump["page_server"]["port"] > 0 and dump["frozen_ms"] > 0, dump
        # The memory is not in the image: 64 MiB of counter state stayed with the source.
        assert manifest["total_bytes"] < 16 * 1024 * 1024, manifest["total_bytes"]

        # The source's frozen copy outlives the stream: gone now means no longer streaming afterwards.
        source_alive = pid_alive(pid)
        assert source_alive or lazy_side(b, checkpoint_id, "receiver").get("state") != "streaming"
        at_restore = len(steps(log))
        after = wait_steps(log, at_restore + 30)
        assert after == list(range(1, len(after) + 1)), "the counter reset, skipped or repeated a step"
        receiver = wait_for(lambda: lazy_side(b, checkpoint_id, "receiver").get("state") in ("complete", "failed")
                            and lazy_side(b, checkpoint_id, "receiver"), 30, what="every page to arrive")
        assert receiver["state"] == "complete", receiver
        assert receiver["pages_arrived"] == receiver["pages_expected"] > 64 * 256, receiver
        assert receiver["all_pages_s"] > 0 and receiver["userfaultfds_held"] >= 1
        source = wait_for(lambda: lazy_side(a, checkpoint_id, "source").get("state") in ("complete", "failed")
                          and lazy_side(a, checkpoint_id, "source"), 30, what="the source's page server to end")
        assert source["state"] == "complete" and source["decision"] == "released", source
        assert source["receiver_report"] == "complete" and receiver["source_decision"] == "released"
        # The source's copy went only after the receiver had every page, and the receiver counted the move
        # as done only after the source had released its copy.
        assert receiver["all_pages_at"] <= source["at"] <= receiver["at"]
        wait_for(lambda: not pid_alive(pid), 10, what="the source's frozen copy to go")
        assert pid_alive(new_pid)
        final = wait_steps(log, len(after) + 20)
        assert final == list(range(1, len(final) + 1))  # steps() also asserts every memory check said ok
        assert next(w for w in b.client.get("/v1/workloads")["workloads"]
                    if w["id"] == "lazy-counter")["state"] == "running"
    finally:
        kill_pid(new_pid)
        kill_pid(pid)
        proc.wait(10)


def test_a_source_agent_killed_mid_stream_takes_the_release_up_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The source's agent dies while CRIU serves the pages (CRIU runs on in its own session) and the
    receiver's reports find nobody; restarted, it reads how the page server ended and waits for the
    receiver's word again, which releases its stopped copy: the workload runs on once, on the receiver."""
    # A lease long enough for the restart on a loaded machine: the receiver waits 20 s for word.
    a, b = lazy_agents(tmp_path, lazy_release_timeout_s="40")
    log = tmp_path / "counter.log"
    proc, pid = start_in_pid_namespace(log, megabytes=64)
    new_pid = 0
    try:
        wait_steps(log, 20)
        workload = "lazy-restart"
        assert a.client.call("/v1/workloads", "reg", workload_id=workload, pid=pid)["state"] == "succeeded"
        op = a.client.call("/v1/checkpoint", "ck", workload_id=workload, lazy_pages=True)
        assert op["state"] == "succeeded", op
        manifest, checkpoint_id = op["result"]["manifest"], op["result"]["checkpoint_id"]
        share = a.client.call("/v1/share", "share", checkpoint_id=checkpoint_id, to=b.node)
        fetched = b.client.call("/v1/fetch", "fetch", checkpoint_id=checkpoint_id,
                                source=f"http://127.0.0.1:{a.port}", token=share["result"]["token"],
                                sha256=image_digest(manifest))
        assert fetched["state"] == "succeeded", fetched
        assert a.proc is not None
        a.proc.kill()  # no goodbye: the watch on the page server dies with it
        a.proc.wait(10)
        restored = b.client.call("/v1/restore", "rs", checkpoint_id=checkpoint_id)
        assert restored["state"] == "succeeded", restored
        new_pid = int(restored["result"]["pid"])
        # The stream runs without the source's agent; the receiver, unanswered, keeps its copy for now.
        wait_for(lambda: lazy_side(b, checkpoint_id, "receiver").get("state") != "streaming", 30,
                 what="every page to arrive")
        assert lazy_side(b, checkpoint_id, "receiver")["state"] == "releasing"
        # The source's copy waits, stopped, for a decision nobody can take yet.
        assert pid_alive(new_pid) and stopped(pid)
        a.start()
        source = wait_for(lambda: lazy_side(a, checkpoint_id, "source").get("state") in ("complete", "failed")
                          and lazy_side(a, checkpoint_id, "source"), 30, what="the restarted source to settle")
        assert source["recovered"] is True and source["page_server"]["state"] == "complete", source
        assert source["decision"] == "released" and source["state"] == "complete", source
        receiver = wait_for(lambda: lazy_side(b, checkpoint_id, "receiver").get("state") in ("complete", "failed")
                            and lazy_side(b, checkpoint_id, "receiver"), 30, what="the receiver to settle")
        assert receiver["state"] == "complete" and receiver["source_decision"] == "released", receiver
        wait_for(lambda: not pid_alive(pid), 10, what="the released source copy to go")
        counted = len(steps(log))
        final = wait_steps(log, counted + 20)
        assert final == list(range(1, len(final) + 1)) and pid_alive(new_pid)
    finally:
        kill_pid(new_pid)
        kill_pid(pid)
        proc.wait(10)
        a.stop()
        b.stop()


def test_a_receiving_agent_killed_mid_stream_never_lets_the_workload_run_twice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The receiving agent dies after the restore and stays dead: the stream completes without it and
    nobody tells the source. Its fence process kills the restored copy once the lease has gone without
    word from the source (half of lazy_release_timeout_s); only then, at the whole timeout, does the
    source resume its stopped copy. At no moment do both run."""
    a, b = lazy_agents(tmp_path, lazy_release_timeout_s="10")
    log = tmp_path / "counter.log"
    proc, pid = start_in_pid_namespace(log, megabytes=64)
    new_pid = 0
    try:
        wait_steps(log, 20)
        manifest, new_pid = move_lazily(a, b, "lazy-orphan", pid)
        checkpoint_id = manifest["checkpoint_id"]
        assert b.proc is not None
        b.proc.kill()  # its daemon, its fence and the restored copy outlive it
        b.proc.wait(10)
        both = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pid_alive(new_pid) and pid_alive(pid) and not stopped(pid):
                both += 1
            source = lazy_side(a, checkpoint_id, "source")
            if source.get("state") in ("complete", "failed") and not pid_alive(new_pid):
                break
            time.sleep(0.02)
        assert both == 0, f"both copies ran at once in {both} samples"
        assert source["decision"] == "resumed" and source["resumed_on_source"] is True, source
        assert "no word from the receiver" in source["decided_because"], source
        assert not pid_alive(new_pid) and pid_alive(pid)
        # The source's copy runs on from where it was frozen (the restored copy's steps since are lost).
        counted = len(steps(log))
        wait_steps(log, counted + 20)  # every memory check still says ok
    finally:
        kill_pid(new_pid)
        kill_pid(pid)
        proc.wait(10)
        a.stop()
        b.stop()


def waiting_in_recv(pid: int) -> bool:
    """Whether `pid`'s main thread is blocked in recvfrom(2) (x86_64: 45; aarch64: 207)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return bool(call) and call[0] == {"x86_64": "45", "aarch64": "207"}.get(os.uname().machine, "")


def quiet_connection(port: int) -> bool:
    """Whether both ends of the loopback connection to `port` have empty send and receive queues."""
    ends = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
        if state == "01" and (int(local.split(":")[1], 16) == port or int(remote.split(":")[1], 16) == port):
            ends.append(queues)
    return len(ends) == 2 and all(q == "00000000:00000000" for q in ends)


def test_a_receiver_daemon_killed_between_pages_ends_the_source_page_server_complete_and_the_source_resumes(
        agents, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The defect the two-phase release fixed, provoked: CRIU 4.1.1's page server takes a connection closed
    cleanly for the end of the stream (page-xfer.c: recv() == 0 ends it with success), so a receiver daemon
    killed with nothing unread and no request open (a FIN, not a reset) ends
    the source's page server "complete" with pages missing on the receiver (the test kills it when
    neither end of the stream's connection has anything queued). Before, the source's copy was
    killed then; now it stays stopped and is resumed on the receiver's "failed"."""
    a, b = agents
    windows = 0
    attempts = 8
    for attempt in range(attempts):
        log = tmp_path / f"counter-{attempt}.log"
        proc, pid = start_in_pid_namespace(log, megabytes=400)
        new_pid = 0
        try:
            wait_steps(log, 20, timeout=60)
            workload = f"lazy-late-{attempt}"
            manifest, new_pid = move_lazily(a, b, workload, pid)
            checkpoint_id = manifest["checkpoint_id"]
            daemons = [p for p in processes_mentioning("--page-server")
                       if b"lazy-pages" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
            assert daemons
            dumps = [p for p in processes_mentioning("--lazy-pages")
                     if b"dump" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
            assert dumps
            port = int(manifest["engine_data"]["dump"]["page_server"]["port"])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and pid_alive(daemons[0]):
                # Nothing in flight either way on the stream's connection, and the source's CRIU blocked
                # waiting for the next request: the daemon has read every answer and asked nothing more.
                if waiting_in_recv(dumps[0]) and quiet_connection(port):
                    os.kill(daemons[0], signal.SIGKILL)
                    break
            source = wait_for(lambda: lazy_side(a, checkpoint_id, "source").get("state") in  # noqa: B023
                              ("complete", "failed") and lazy_side(a, checkpoint_id, "source"),  # noqa: B023
                              60, what="the source to settle")
            receiver = wait_for(lambda: lazy_side(b, checkpoint_id, "receiver").get("state") in  # noqa: B023
                                ("complete", "failed") and lazy_side(b, checkpoint_id, "receiver"),  # noqa: B023
                                60, what="the receiver to settle")
            # Whatever the moment: exactly one copy runs on, and its progress continues.
            if receiver["state"] == "complete":
                assert source["decision"] == "released", source
                wait_for(lambda: not pid_alive(pid), 10, what="the released source copy to go")  # noqa: B023
                assert pid_alive(new_pid)
            else:
                assert source["decision"] == "resumed" and source["resumed_on_source"] is True, source
                wait_for(lambda: not pid_alive(new_pid), 10, what="the restored copy to go")  # noqa: B023
                assert pid_alive(pid)
                if source["page_server"]["state"] == "complete":
                    windows += 1  # the defect's window: before the fix the workload was lost here
            counted = len(steps(log))
            wait_steps(log, counted + 10)
        finally:
            kill_pid(new_pid)
            kill_pid(pid)
            proc.wait(10)
        if windows:
            break
    if not windows:
        # Each attempt above held the guarantee (asserted); landing the window is a race (about 1 try in 3
        # here), so missing it every time is reported, not failed, and never skipped (CI forbids skips).
        print(f"the daemon was not killed inside the window in {attempts} attempts (the stream ended, or the "
              "source was busy sending and saw a reset): every attempt kept the workload on one side")


@pytest.mark.parametrize("cut", ["source page server", "receiver daemon"])
def test_a_stream_cut_leaves_the_workload_running_on_exactly_one_side(agents, tmp_path, cut) -> None:  # type: ignore[no-untyped-def]
    a, b = agents
    # Enough memory that the background stream is usually still running when it is cut. The cut must
    # come mid-stream: the helper is stopped first and its log read; a stream that had already ended
    # (a quiet machine moves 400 MB in under a second) is let finish, both sides must then agree it is
    # complete, and the move is made again with a new counter, up to three times.
    for attempt in range(3):
        log = tmp_path / f"counter-{attempt}.log"
        proc, pid = start_in_pid_namespace(log, megabytes=400)
        new_pid = 0
        wait_steps(log, 20, timeout=60)
        workload = f"lazy-cut-{cut.split()[0]}-{attempt}"
        manifest, new_pid = move_lazily(a, b, workload, pid)
        checkpoint_id = manifest["checkpoint_id"]
        # The source's `criu dump` (its page server) or the receiver's lazy-pages daemon dies mid-stream.
        word, role = (b"dump", "--lazy-pages") if cut == "source page server" else (b"lazy-pages", "--page-server")
        helpers = [p for p in processes_mentioning(role)
                   if word in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
        sources = [p for p in processes_mentioning("--lazy-pages")
                   if b"dump" in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
        for helper in helpers:
            os.kill(helper, signal.SIGSTOP)
        # A source still sending is blocked on the stopped helper by now, unless it had sent its last
        # page: the source's page server then ends complete whatever becomes of the receiver's daemon
        # (the window of the defect the two-phase release fixed), so that counts as an ended stream too.
        time.sleep(0.5)
        if helpers and sources and not any(stream_ended(p) for p in {*helpers, *sources}):
            break
        for helper in helpers:
            os.kill(helper, signal.SIGCONT)
        # Ended before the cut: both sides must agree it is complete, and only the restored copy runs on.
        wait_for(lambda: lazy_side(b, checkpoint_id, "receiver").get("state") == "complete", 30,  # noqa: B023
                 what="an ended stream to complete on the receiver")
        assert lazy_side(a, checkpoint_id, "source")["state"] == "complete"
        wait_for(lambda: not pid_alive(pid), 10, what="the released source copy to go")  # noqa: B023
        assert pid_alive(new_pid)
        counted = len(steps(log))
        wait_steps(log, counted + 10)
        kill_pid(new_pid)
        kill_pid(pid)
        proc.wait(10)
    else:
        pytest.fail(f"the {cut} ended before the test could cut it, three times")
    try:
        for helper in helpers:
            os.kill(helper, signal.SIGKILL)
            os.kill(helper, signal.SIGCONT)
        receiver = wait_for(lambda: lazy_side(b, checkpoint_id, "receiver").get("state") in ("complete", "failed")
                            and lazy_side(b, checkpoint_id, "receiver"), 30, what="the receiver to see the cut")
        assert receiver["state"] == "failed", receiver
        # Its missing pages are gone: the restored copy is killed, never left running on empty pages.
        wait_for(lambda: not pid_alive(new_pid), 10, what="the restored copy to be killed")
        assert next(w for w in b.client.get("/v1/workloads")["workloads"] if w["id"] == workload)["state"] == "exited"
        source = wait_for(lambda: lazy_side(a, checkpoint_id, "source").get("state") in ("complete", "failed")
                          and lazy_side(a, checkpoint_id, "source"), 30, what="the source to settle")
        # Whatever the moment of the cut (even after the source's page server had sent its last page and
        # ended complete: the defect the two-phase release fixed), the source's copy was only stopped,
        # never killed, and is resumed: it runs on from where it was frozen; the receiver's steps since
        # then are lost.
        assert source["state"] == "failed" and source["decision"] == "resumed", source
        assert source["resumed_on_source"] is True, source
        assert pid_alive(pid) and not pid_alive(new_pid), "the workload must run on exactly one side"
        counted = len(steps(log))
        wait_steps(log, counted + 20)  # every memory check still says ok
        assert next(w for w in a.client.get("/v1/workloads")["workloads"] if w["id"] == workload)["state"] == "running"
    finally:
        kill_pid(new_pid)
        kill_pid(pid)
        proc.wait(10)
