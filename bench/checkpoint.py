"""Checkpoint and restore throughput of the agent's criu engine against plain file I/O.

A process holding 1 GiB (agent/tests/data/counter.py) is checkpointed and restored with the
agent's own engine and artifact store, in a folder that also gets a plain write and read of the
same bytes. Target (issue 5): checkpoint >= 0.7 of the plain write rate.

Each trial starts the process, then in the same folder writes a 1 GiB buffer held in memory (the
bytes a checkpoint moves, not one small block rewritten from the CPU's cache) and fsyncs it, reads
it back, and does both again with SHA-256 computed in the same pass; then it checkpoints and
restores the process as the agent does (agent.py):

- checkpoint: `criu dump`, with the page images hashed at low priority while CRIU writes them;
  the process is stopped and its image is in the page cache when this ends. The next row is
  CRIU's own timing from its log, to show what the agent adds;
- durable: the images fsynced, which the agent does before a checkpoint counts as taken, since
  the node is patched and rebooted next and the image is then the workload's only copy;
- sealed: plus the manifest (size and SHA-256 of every file);
- restore: `criu restore` of the images, and the same after verifying every file's hash.

Each is compared with the plain I/O that does the same: the dump with a write into the page
cache, the durable checkpoint with a write and fsync, the sealed one with a write, SHA-256 and
fsync. The target is judged for the checkpoint as the agent takes it (durable) and printed for
the bare dump too. The restored process must go on counting, with no step lost and its memory
intact, or the run fails. Figures are medians over the trials, with the per-trial ratios.

Fairness on a VM: a guest page that was free for a couple of seconds is handed back to the host
(free page reporting), and the next touch pays a host fault, which can double the time to write
1 GiB. An uncounted write before the plain I/O, and the deleted plain-I/O file before the
checkpoint, leave each of them the same amount of just-freed memory.

Needs root and CRIU 4 (scripts/build-criu.sh).

    sudo .venv/bin/python bench/checkpoint.py [--mib 1024] [--trials 15] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "agent" / "src"))

from gpusweep_agent.artifacts import GrowingFileHasher, LocalArtifactStore, fingerprint  # noqa: E402
from gpusweep_agent.config import AgentConfig  # noqa: E402
from gpusweep_agent.engines.criu import CriuEngine  # noqa: E402
from gpusweep_agent.util import pid_alive  # noqa: E402

COUNTER = REPO / "agent" / "tests" / "data" / "counter.py"
TARGET_RATIO = 0.7
GIB = 1024**3
CHUNK = 4 * 1024 * 1024
CRIU_OWN = "(CRIU's own log: dump)"
DURABLE = "checkpoint durable: + fsync (the agent's)"


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def plain_write(path: Path, data: memoryview, digest: Any = None, durable: bool = False) -> float:
    """Write `data` to `path`; with `durable`, fsync it too. Returns the seconds the write alone took."""
    start = time.perf_counter()
    with path.open("wb") as fh:
        for offset in range(0, len(data), CHUNK):
            if digest is not None:
                digest.update(data[offset:offset + CHUNK])
            fh.write(data[offset:offset + CHUNK])
        fh.flush()
        written = time.perf_counter() - start
        if durable:
            os.fsync(fh.fileno())
    return written


def plain_read(path: Path, into: memoryview, digest: Any = None) -> None:
    with path.open("rb") as fh:
        offset = 0
        while count := fh.readinto(into[offset:offset + CHUNK]):
            if digest is not None:
                digest.update(into[offset:offset + count])
            offset += count


def plain_trial(folder: Path, data: memoryview) -> dict[str, float]:
    path = folder / "plain.bin"
    figures: dict[str, float] = {}
    start = time.perf_counter()
    figures["plain write"] = plain_write(path, data, durable=True)
    figures["plain write + fsync"] = time.perf_counter() - start
    figures["plain read"] = timed(lambda: plain_read(path, data))
    path.unlink()
    figures["plain write + SHA-256 + fsync"] = timed(lambda: plain_write(path, data, hashlib.sha256(), durable=True))
    figures["plain read + SHA-256"] = timed(lambda: plain_read(path, data, hashlib.sha256()))
    path.unlink()
    return figures


def criu_seconds(log: Path) -> float:
    """The time stamp of CRIU's last log line: its own view of how long the dump took."""
    stamps = [line[1:line.index(")")] for line in log.read_text().splitlines() if line.startswith("(")]
    return float(stamps[-1]) if stamps else float("nan")


def wait_for_steps(log: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise SystemExit(f"the workload wrote no steps to {log}")


def trial(root: Path, number: int, data: memoryview, engine: CriuEngine,
          store: LocalArtifactStore) -> tuple[dict[str, float], int]:
    log = root / f"counter-{number}.log"
    mib = len(data) // (1024 * 1024)
    proc = subprocess.Popen([sys.executable, str(COUNTER), str(log), str(mib), "0.01"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    restored_pid = 0
    checkpoint_id = f"ck-bench-{number}"
    try:
        wait_for_steps(log, 5)
        # Uncounted: leaves `size` bytes of just-freed memory for the plain write, as the plain
        # I/O's deleted file leaves for the checkpoint after it (see the docstring).
        ballast = root / "ballast.bin"
        plain_write(ballast, data)
        ballast.unlink()
        figures = plain_trial(root, data)

        workload: dict[str, Any] = {"id": f"bench-{number}", "pid": proc.pid}
        image_dir = store.image_dir(checkpoint_id)
        t0 = time.perf_counter()
        # As the agent does it (agent.py): the page images are hashed while CRIU writes them.
        with GrowingFileHasher(image_dir) as hasher:
            engine_data = engine.checkpoint(workload, image_dir, False, lambda **_: None)
            t1 = time.perf_counter()
            store.make_durable(checkpoint_id)
            t1_durable = time.perf_counter()
        criu_said = criu_seconds(engine.log_path(image_dir, "dump"))
        manifest = store.build_manifest(checkpoint_id, workload, "criu", fingerprint({}, workload), engine_data,
                                        hasher.digests())
        store.write_manifest(checkpoint_id, manifest)
        t2 = time.perf_counter()
        proc.wait(30)
        steps_at_checkpoint = len(log.read_text().splitlines())

        t3 = time.perf_counter()
        store.verify(checkpoint_id)
        t4 = time.perf_counter()
        restored_pid = engine.restore(manifest, image_dir, root / f"restore-{number}")
        t5 = time.perf_counter()
        wait_for_steps(log, steps_at_checkpoint + 5, timeout=30)
        lines = log.read_text().splitlines()
        bad = [line for line in lines if not line.endswith(" ok")]
        steps = [int(line.split()[0]) for line in lines]
        if bad or steps != list(range(1, len(steps) + 1)):
            raise SystemExit(f"the restored process lost memory or steps: {bad[:3] or steps[-10:]}")
    finally:
        for pid in (proc.pid, restored_pid):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)
        store.discard(checkpoint_id)
    figures.update({"checkpoint: CRIU dump": t1 - t0, CRIU_OWN: criu_said,
                    DURABLE: t1_durable - t0, "checkpoint sealed: + SHA-256 manifest": t2 - t0,
                    "restore: CRIU restore": t5 - t4, "restore: verify hashes + restore": t5 - t3})
    return figures, int(manifest["total_bytes"])


# Each checkpoint row is compared with the plain I/O that moves the same bytes the same way.
BASELINE = {
    "checkpoint: CRIU dump": "plain write",
    DURABLE: "plain write + fsync",
    "checkpoint sealed: + SHA-256 manifest": "plain write + SHA-256 + fsync",
    "restore: CRIU restore": "plain read",
    "restore: verify hashes + restore": "plain read + SHA-256",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="memory the process holds (MiB)")
    parser.add_argument("--trials", type=int, default=15, help="trials; the figures are medians")
    parser.add_argument("--dir", default=None, help="folder for images and the plain I/O (default: a temp folder)")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("criu") is None:
        print("bench/checkpoint.py needs root and CRIU 4: run scripts/build-criu.sh as root", file=sys.stderr)
        return 2

    root = Path(tempfile.mkdtemp(prefix="gpusweep-bench-", dir=args.dir))
    config = AgentConfig(node="bench", key="bench", state_dir=root / "state", artifact_dir=root / "artifacts")
    engine = CriuEngine(config)
    engine.check()
    store = LocalArtifactStore(config.artifact_dir)
    size = args.mib * 1024 * 1024
    # The plain I/O moves the same bytes as the checkpoint: a buffer as large as the process's
    # state, in memory (not one small block written again and again from the CPU's cache).
    data = memoryview(bytearray(bytes(range(256)) * (size // 256)))
    seconds: dict[str, list[float]] = {}
    image_bytes = 0
    try:
        for number in range(1, args.trials + 1):
            figures, image_bytes = trial(root, number, data, engine, store)
            for name, value in figures.items():
                seconds.setdefault(name, []).append(value)
            print(f"trial {number}: " + ", ".join(f"{name} {value:.3f} s" for name, value in figures.items()),
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def rate(name: str) -> float:
        nbytes = size if name.startswith("plain") else image_bytes
        return nbytes / GIB / statistics.median(seconds[name])

    print(f"\nprocess holding {args.mib} MiB ({image_bytes} bytes of images); {args.trials} trials in "
          f"{args.dir or tempfile.gettempdir()}; {os.cpu_count()} CPUs")
    print(f"{'median of ' + str(args.trials):44} {'seconds':>8} {'GiB/s':>7}   vs the same bytes in plain I/O")
    for name, values in seconds.items():
        base = BASELINE.get(name)
        versus = f"{rate(name) / rate(base):5.2f}x {base}" if base else ""
        print(f"{name:44} {statistics.median(values):8.3f} {rate(name):7.2f}   {versus}")
    verdicts = []
    for row in (DURABLE, "checkpoint: CRIU dump"):
        base = BASELINE[row]
        per_trial = sorted(b / c for b, c in zip(seconds[base], seconds[row], strict=True))
        ratio = rate(row) / rate(base)
        verdicts.append(ratio >= TARGET_RATIO)
        print(f"{row} / {base}, rate per trial: {', '.join(f'{r:.2f}' for r in per_trial)}")
        print(f"  target >= {TARGET_RATIO}: {ratio:.2f} ({'met' if ratio >= TARGET_RATIO else 'MISSED'})")
    return 0 if verdicts[0] else 1


if __name__ == "__main__":
    sys.exit(main())
