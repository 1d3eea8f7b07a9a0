"""Checkpoint images from agent to agent against a plain HTTP copy of the same files (issue 33).

Two real agents (`python -m gpusweep_agent.main`, each with its own store) on loopback. The source
holds a sealed 1 GiB checkpoint shaped like a CRIU image folder: one large pages file, a second
smaller one, and the pagemap, core, mm, fdinfo and other small images, with the manifest the agent
writes (LocalArtifactStore.build_manifest). Each trial, alternately:

- curl: one `curl` process copies every file of the folder over plain HTTP on the same loopback,
  one after another on one kept-alive connection, from the source agent's transfer endpoint (the
  server the agent-to-agent path uses: `sendfile`, so both clients read the same server), no hash;
- curl from `python -m http.server` serving the same folder, for a server that is not ours;
- agent to agent, the product's path (executors/slurm.py `_transfer`): `POST /v1/share` on the
  source, then `POST /v1/fetch` on the receiver, signed, which runs transfer.fetch: manifest
  checked against the image digest, every file's size and SHA-256 checked, the folder put in place
  with its manifest last. Timed from the fetch request to its operation's success, polled every
  10 ms (the service polls every 200 ms; that wait is left out).

Afterwards every fetched file is compared with the source's SHA-256 again, or the run fails. Before
each timed copy an uncounted write of as many bytes is deleted (see `settle`) and the page cache
flushed (`sync`); the received files are deleted after. It prints the CPU seconds of each client
and server too: where the machine is busy, the copy rates follow them.
Target: agent to agent >= 0.8x the curl copy from the same server (medians).

    .venv/bin/python bench/transfer.py [--mib 1024] [--trials 5] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "agent" / "src"), str(REPO / "agent" / "tests")]

from agent_helpers import CLUSTER, AgentProcess, free_port, wait_for  # noqa: E402
from gpusweep_agent.artifacts import LocalArtifactStore, sha256_file  # noqa: E402
from gpusweep_agent.transfer import TOKEN_HEADER, image_digest  # noqa: E402

TARGET_RATIO = 0.8
CHECKPOINT = "ck-benchtransfer000000"
MIB = 1024 * 1024
# The small images of a CRIU dump of one process (name, bytes), as `criu dump` leaves them.
SMALL = [
    ("core-1.img", 6_000),
    ("core-2.img", 1_200),
    ("mm-1.img", 9_800),
    ("pagemap-1.img", 48_000),
    ("pstree.img", 40),
    ("files.img", 900),
    ("fdinfo-2.img", 300),
    ("fs-1.img", 30),
    ("ids-1.img", 40),
    ("inventory.img", 60),
    ("tty-info.img", 200),
    ("seccomp.img", 20),
    ("timens-0.img", 30),
    ("pagemap-shmem-1.img", 120),
    ("tmpfs-dev-64.tar.gz.img", 400_000),
    ("stats-dump", 40),
    ("sigacts-1.img", 700),
    ("utsns-11.img", 80),
    ("ipcns-var-10.img", 140),
    ("cgroup.img", 5_000),
]


def make_image(store: LocalArtifactStore, mib: int) -> dict[str, Any]:
    folder = store.image_dir(CHECKPOINT)
    folder.mkdir(parents=True)
    block = os.urandom(64 * MIB)  # incompressible, written again and again (hashing cares not)
    small = sum(size for _, size in SMALL)
    second = 48 * MIB
    for name, size in (("pages-1.img", mib * MIB - second - small), ("pages-2.img", second)):
        with (folder / name).open("wb") as fh:
            left = size
            while left:
                left -= fh.write(block[: min(left, len(block))])
    for name, size in SMALL:
        (folder / name).write_bytes(os.urandom(size))
    manifest = store.build_manifest(CHECKPOINT, {"id": "bench"}, "criu", {}, {})
    store.write_manifest(CHECKPOINT, manifest)
    return manifest


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process so far, all its threads (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(root: Path, nbytes: int) -> None:
    """Before each timed copy: leave it `nbytes` of just-freed memory, then flush the page cache.

    On a VM, a guest page free for a couple of seconds goes back to the host (free page reporting)
    and its next touch pays a host fault, which can double the time of a 1 GiB copy; an uncounted
    write of as many bytes, deleted at once, gives each copy the same start (as bench/checkpoint.py).
    """
    block = bytes(64 * MIB)
    ballast = root / "ballast.bin"
    with ballast.open("wb") as fh:
        for _ in range(0, nbytes, len(block)):
            fh.write(block)
    ballast.unlink()  # freed before it is written back
    os.sync()


def curl(
    base: str, names: list[str], into: Path, total_bytes: int, server: int, token: str = ""
) -> tuple[float, float, float]:
    """One curl copying every file, sequentially on one connection: seconds, curl's CPU, the server's CPU."""
    into.mkdir(parents=True, exist_ok=True)
    args = ["curl", "-sS", "--fail"]
    if token:
        args += ["-H", f"{TOKEN_HEADER}: {token}"]
    for name in names:
        args += [f"{base}/{name}", "-o", str(into / name)]
    settle(into.parent, total_bytes)
    before, served = os.times(), cpu_seconds(server)
    start = time.perf_counter()
    subprocess.run(args, check=True)
    seconds = time.perf_counter() - start
    after = os.times()
    used = after.children_user + after.children_system - before.children_user - before.children_system
    return seconds, used, cpu_seconds(server) - served


def agent_fetch(
    receiver: AgentProcess, source: AgentProcess, token: str, digest: str, number: int, total_bytes: int
) -> tuple[float, float, float]:
    """The receiver's fetch operation: seconds, the receiving agent's CPU, the source agent's CPU."""
    assert receiver.proc is not None and source.proc is not None
    settle(receiver.state.parent, total_bytes)
    used, served = cpu_seconds(receiver.proc.pid), cpu_seconds(source.proc.pid)
    start = time.perf_counter()
    op = receiver.client.submit(
        "/v1/fetch",
        f"bench-fetch-{number}",
        checkpoint_id=CHECKPOINT,
        source=f"http://127.0.0.1:{source.port}",
        token=token,
        sha256=digest,
    )
    done = receiver.client.wait(op, timeout=600, interval=0.01)
    seconds = time.perf_counter() - start
    if done["state"] != "succeeded":
        raise SystemExit(f"the fetch failed: {done.get('error')}")
    return seconds, cpu_seconds(receiver.proc.pid) - used, cpu_seconds(source.proc.pid) - served


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="size of the checkpoint image (MiB)")
    parser.add_argument("--trials", type=int, default=5, help="trials of each; the figures are medians")
    parser.add_argument("--dir", default=None, help="folder for both stores (default: a temp folder)")
    args = parser.parse_args()
    if shutil.which("curl") is None:
        print("bench/transfer.py needs curl", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="gpusweep-transfer-", dir=args.dir))
    stores = LocalArtifactStore(root / "store-a"), LocalArtifactStore(root / "store-b")
    agents: list[AgentProcess] = []
    plain: subprocess.Popen[bytes] | None = None
    try:
        manifest = make_image(stores[0], args.mib)
        files = [dict(f) for f in manifest["files"]]
        names = [str(f["path"]) for f in files]
        total = int(manifest["total_bytes"])
        source = AgentProcess(root, "source", stores[0].root).start()
        agents.append(source)
        receiver = AgentProcess(root, "receiver", stores[1].root).start()
        agents.append(receiver)
        share = source.client.call("/v1/share", "bench-share", checkpoint_id=CHECKPOINT, to=f"{CLUSTER}/receiver")
        token = str(share["result"]["token"])
        port = free_port()
        plain = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "http.server",
                str(port),
                "--bind",
                "127.0.0.1",
                "--directory",
                str(stores[0].image_dir(CHECKPOINT)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: (
                subprocess.run(
                    ["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/pstree.img"], check=False
                ).returncode
                == 0
            ),
            10,
            what="python -m http.server",
        )
        digest = image_digest(manifest)
        runs: dict[str, list[tuple[float, float, float]]] = {
            "curl": [],
            "curl from http.server": [],
            "agent to agent": [],
        }
        fetched = stores[1].image_dir(CHECKPOINT)
        assert source.proc is not None
        for number in range(1, args.trials + 1):
            copy = root / "curl"
            base = f"http://127.0.0.1:{source.port}/v1/transfer/{CHECKPOINT}"
            runs["curl"].append(curl(base, names, copy, total, source.proc.pid, token))
            shutil.rmtree(copy)
            runs["curl from http.server"].append(curl(f"http://127.0.0.1:{port}", names, copy, total, plain.pid))
            shutil.rmtree(copy)
            runs["agent to agent"].append(agent_fetch(receiver, source, token, digest, number, total))
            wrong = [f["path"] for f in files if sha256_file(fetched / str(f["path"])) != f["sha256"]]
            if wrong:
                raise SystemExit(f"fetched files differ from the source: {wrong}")
            shutil.rmtree(fetched)
            print(f"trial {number}: " + ", ".join(f"{k} {v[-1][0]:.3f} s" for k, v in runs.items()), flush=True)
    finally:
        if plain is not None:
            plain.terminate()
            plain.wait(10)
        for agent in agents:
            agent.stop()
        shutil.rmtree(root, ignore_errors=True)

    def median(name: str, column: int) -> float:
        return statistics.median(run[column] for run in runs[name])

    largest = max(int(f["size"]) for f in files) / MIB
    print(
        f"\n{total / MIB:.0f} MiB in {len(files)} files (largest {largest:.0f} MiB), "
        f"{args.trials} trials, loopback, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'median':24} {'seconds':>8} {'MiB/s':>7} {'client CPU s':>13} {'server CPU s':>13}")
    for name in runs:
        rate = total / MIB / median(name, 0)
        print(f"{name:24} {median(name, 0):8.3f} {rate:7.0f} {median(name, 1):13.3f} {median(name, 2):13.3f}")
    ratio = median("curl", 0) / median("agent to agent", 0)
    per_trial = sorted(c[0] / a[0] for c, a in zip(runs["curl"], runs["agent to agent"], strict=True))
    print("agent to agent (SHA-256 verified) / curl, per trial: " + ", ".join(f"{r:.2f}" for r in per_trial))
    print(
        f"target >= {TARGET_RATIO}: {ratio:.2f} ({'met' if ratio >= TARGET_RATIO else 'MISSED'}); "
        f"every fetched file matched its SHA-256"
    )
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
