"""Checkpoint and restore throughput of the agent's criu engine against plain file I/O.

A process holding 1 GiB (agent/tests/data/counter.py) is checkpointed and restored with the
agent's own engine and artifact store, in a folder that also gets a plain write and read of the
same number of bytes, in the same run. Target (issue 5): checkpoint >= 0.7 of the plain write rate.

Figures: CRIU dump (with the page images hashed alongside, as the agent does); checkpoint as the
agent does it (dump + SHA-256 manifest of every file); restore as the agent does it (hash
verification + CRIU restore) and CRIU restore alone. The plain write has no fsync, like CRIU; after
an uncounted warm-up it runs before and after the checkpoint and the faster run is the baseline.
Needs root and CRIU 4 (scripts/build-criu.sh).

    sudo .venv/bin/python bench/checkpoint.py [--mib 1024] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


def plain_io(folder: Path, size: int) -> tuple[float, float]:
    """Seconds to write then read `size` bytes through ordinary buffered file I/O (no fsync, like CRIU)."""
    block = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    path = folder / "plain.bin"
    start = time.perf_counter()
    with path.open("wb") as fh:
        for _ in range(size // len(block)):
            fh.write(block)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    with path.open("rb") as fh:
        while fh.readinto(bytearray(len(block))):
            pass
    read_s = time.perf_counter() - start
    path.unlink()
    return write_s, read_s


def wait_for_steps(log: Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise SystemExit(f"the workload wrote no steps to {log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="memory the process holds (MiB)")
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
    log = root / "counter.log"
    proc = subprocess.Popen([sys.executable, str(COUNTER), str(log), str(args.mib), "0.01"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    restored_pid = 0
    try:
        wait_for_steps(log, 5)
        size = args.mib * 1024 * 1024
        # A first large write on a fresh VM pays for faulting in guest memory: warm up, uncounted.
        plain_io(root, size)
        write_s, read_s = plain_io(root, size)

        workload: dict[str, Any] = {"id": "bench", "pid": proc.pid}
        checkpoint_id = "ck-bench"
        image_dir = store.image_dir(checkpoint_id)
        t0 = time.perf_counter()
        # As the agent does it: the page images are hashed while CRIU writes them.
        with GrowingFileHasher(image_dir) as hasher:
            data = engine.checkpoint(workload, image_dir, False, lambda **_: None)
            t1 = time.perf_counter()
        manifest = store.build_manifest(checkpoint_id, workload, "criu", fingerprint({}, workload), data,
                                        hasher.digests())
        store.write_manifest(checkpoint_id, manifest)
        t2 = time.perf_counter()
        proc.wait(30)
        image_bytes = manifest["total_bytes"]

        t3 = time.perf_counter()
        store.verify(checkpoint_id)
        t4 = time.perf_counter()
        restored_pid = engine.restore(manifest, image_dir, root / "restore")
        t5 = time.perf_counter()
        before = len(log.read_text().splitlines())
        wait_for_steps(log, before + 5, timeout=30)
        bad = [line for line in log.read_text().splitlines() if not line.endswith(" ok")]
        if bad:
            raise SystemExit(f"restored process reports corrupted memory: {bad[:3]}")
        os.kill(restored_pid, signal.SIGKILL)
        # Plain I/O again after; the baseline is the faster of the two runs (the stricter comparison).
        write_again, read_again = plain_io(root, size)
        print(f"plain I/O before/after: write {write_s:.3f}/{write_again:.3f} s, read {read_s:.3f}/{read_again:.3f} s")
        write_s, read_s = min(write_s, write_again), min(read_s, read_again)
    finally:
        for pid in (proc.pid, restored_pid):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)

    def rate(nbytes: int, seconds: float) -> float:
        return nbytes / GIB / seconds

    plain_w, plain_r = rate(size, write_s), rate(size, read_s)
    rows = [
        ("plain file write", size, write_s, plain_w),
        ("plain file read", size, read_s, plain_r),
        ("checkpoint: CRIU dump", image_bytes, t1 - t0, rate(image_bytes, t1 - t0)),
        ("checkpoint: dump + SHA-256 manifest", image_bytes, t2 - t0, rate(image_bytes, t2 - t0)),
        ("restore: CRIU restore", image_bytes, t5 - t4, rate(image_bytes, t5 - t4)),
        ("restore: verify hashes + restore", image_bytes, t5 - t3, rate(image_bytes, t5 - t3)),
    ]
    print(f"process holding {args.mib} MiB; images and plain I/O in {root} ({os.cpu_count()} CPUs)")
    print(f"{'':38} {'bytes':>13} {'seconds':>8} {'GiB/s':>7} {'vs plain':>9}")
    for name, nbytes, seconds, gibs in rows:
        base = plain_r if "read" in name or name.startswith("restore") else plain_w
        print(f"{name:38} {nbytes:13d} {seconds:8.3f} {gibs:7.2f} {gibs / base:8.2f}x")
    dump_ratio, full_ratio = rows[2][3] / plain_w, rows[3][3] / plain_w
    print(f"target: checkpoint >= {TARGET_RATIO} x plain write: CRIU dump {dump_ratio:.2f} "
          f"({'met' if dump_ratio >= TARGET_RATIO else 'MISSED'}), with manifest {full_ratio:.2f} "
          f"({'met' if full_ratio >= TARGET_RATIO else 'MISSED'})")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
