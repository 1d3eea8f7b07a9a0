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

With `--pause` (issue 33) it measures instead the pause of a CRIU move as the workload sees it:
a process holding 1 GiB that dirties 5% of its memory per second and stamps the time every 10 ms
is registered with a real agent (`python -m gpusweep_agent.main`), checkpointed through the
agent's API (`POST /v1/checkpoint`) and restored at once by a second agent sharing the store
(`POST /v1/restore`, hashes verified): the pause is the largest gap between two of its own time
stamps (an uncounted 1 GiB write, deleted, before each checkpoint: see "Fairness" above). Each
trial does it with pre-dumps (`criu_pre_dumps` 3: rounds of `criu pre-dump
--track-mem` while it runs, then a dump of what changed) and without (0), alternately. Where the
kernel tracks no dirty memory the agent dumps plainly and says why; the bench prints what the
agent recorded (mode, rounds, CRIU's frozen time). A third row moves it lazily (`lazy_pages`:
engines/lazy.py): the images without the memory, then the pages streamed from the source's CRIU
page server while the restored process runs; it prints the pages streamed and when all had arrived.
The workload runs in a PID namespace of its own in every row (the lazy source's frozen copy and the
restored one exist at once on this one host). Target: a pause of 1 s or less.

Needs root and CRIU 4 (scripts/build-criu.sh).

    sudo .venv/bin/python bench/checkpoint.py [--mib 1024] [--trials 15] [--dir /var/tmp]
    sudo .venv/bin/python bench/checkpoint.py --pause [--mib 1024] [--trials 3] [--dirty 0.05] [--rows with,plain,lazy]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
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


# The workload of --pause: MiB held, the share of it dirtied per second, a time stamp every 10 ms.
DIRTIER = """
import sys, time
log_path, mib, share = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
state = bytearray(b"x" * (mib << 20))
pages, tick = len(state) // 4096, 0.01
per_tick = max(1, int(pages * share * tick))
at = step = 0
log = open(log_path, "a", buffering=1)
while True:
    step += 1
    for _ in range(per_tick):  # one byte in each page dirties the page
        state[at * 4096] = step & 0xFF
        at = (at + 1) % pages
    log.write(f"{time.time():.6f}\\n")
    time.sleep(tick)
"""


def stamps(log: Path) -> list[float]:
    return [float(line) for line in log.read_text().split()]


# The rows of --pause, alternated in each trial: name -> (agent settings, checkpoint request fields).
PAUSE_MODES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "with pre-dumps (criu_pre_dumps 3)": ({"criu_pre_dumps": "3"}, {}),
    "plain (criu_pre_dumps 0)": ({"criu_pre_dumps": "0"}, {}),
    "lazy (lazy_pages)": ({"criu_pre_dumps": "0"}, {"lazy_pages": True}),
}


def pause_trial(root: Path, number: int, mib: int, dirty: float, mode: str) -> dict[str, Any]:
    """One move through real agents; the workload's largest gap and what the agent recorded."""
    from agent_helpers import AgentProcess  # agent/tests: the real agent processes the tests use

    settings, request = PAUSE_MODES[mode]
    tag = f"{number}{list(PAUSE_MODES).index(mode)}"
    store = root / f"store-{tag}"
    source = AgentProcess(root, f"src{tag}", store, **settings).start()
    target = AgentProcess(root, f"dst{tag}", store, **settings).start()
    log = root / f"dirtier-{tag}.log"
    script = root / "dirtier.py"
    script.write_text(DIRTIER)
    # In a PID namespace of its own (every row alike): a lazy move keeps the source's frozen copy while
    # the restored one runs, both on this host, and CRIU restores a process under its own pid.
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "setsid", sys.executable, str(script), str(log), str(mib),
                             str(dirty)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    pid = restored = 0
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and len(stamps(log)) > 100) and time.monotonic() < deadline:
            time.sleep(0.1)  # 1 GiB allocated and a second of dirtying
        pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        workload = f"dirtier-{tag}"
        source.client.call("/v1/workloads", f"reg-{workload}", workload_id=workload, pid=pid)
        # Uncounted, while it runs: as much just-freed memory for the images as the plain I/O gets
        # above (see the docstring: free page reporting), so the pause is not the VM's host faults.
        block = bytes(64 * 1024 * 1024)
        with (root / "ballast.bin").open("wb") as fh:
            for _ in range(mib // 64 + 1):
                fh.write(block)
        (root / "ballast.bin").unlink()
        t0, w0 = time.perf_counter(), time.time()
        done = source.client.wait(source.client.submit("/v1/checkpoint", f"ck-{workload}", workload_id=workload,
                                                       **request), interval=0.01)
        t1 = time.perf_counter()
        if done["state"] != "succeeded":
            raise SystemExit(f"checkpoint failed: {done.get('error')}")
        checkpoint_id = done["result"]["checkpoint_id"]
        back = target.client.wait(target.client.submit("/v1/restore", f"rs-{workload}", checkpoint_id=checkpoint_id),
                                  interval=0.01)
        t2, w2 = time.perf_counter(), time.time()
        if back["state"] != "succeeded":
            raise SystemExit(f"restore failed: {back.get('error')}")
        restored = int(back["result"]["pid"])
        lazy: dict[str, Any] = {}
        if request.get("lazy_pages"):
            while lazy.get("state") not in ("complete", "failed") and time.monotonic() < deadline + 120:
                time.sleep(0.05)
                lazy = (target.client.get(f"/v1/checkpoints/{checkpoint_id}").get("lazy") or {}).get("receiver") or {}
        count = len(stamps(log))
        while len(stamps(log)) < count + 50 and time.monotonic() < deadline + 180:
            time.sleep(0.05)
        times = stamps(log)
        dump = done["result"]["manifest"]["engine_data"]["dump"]
        gap, before = max((b - a, a) for a, b in itertools.pairwise(times))
        # Where the pause lies: its start after the checkpoint call began, its end after the restore returned.
        where = (before - w0, before + gap - w2)
        return {"pause": gap, "where": where, "checkpoint call": t1 - t0,
                "restore call": t2 - t1, "image bytes": done["result"]["manifest"]["total_bytes"], "dump": dump,
                "lazy": lazy}
    finally:
        for victim in (pid, restored):
            if victim and pid_alive(victim):
                os.kill(victim, signal.SIGKILL)
        proc.wait(30)
        source.stop()
        target.stop()
        shutil.rmtree(store, ignore_errors=True)


def pause_main(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="gpusweep-pause-", dir=args.dir))
    sys.path.insert(0, str(REPO / "agent" / "tests"))
    chosen = [mode for mode in PAUSE_MODES if mode.split()[0] in args.rows.split(",")]
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in chosen}
    loads = [os.getloadavg()[0]]
    try:
        for number in range(1, args.trials + 1):
            for mode in results:
                result = pause_trial(root, number, args.mib, args.dirty, mode)
                results[mode].append(result)
                loads.append(os.getloadavg()[0])
                dump, lazy = result["dump"], result["lazy"]
                rounds = ", ".join(f"{r['kind']} {r['seconds']:.2f} s {r.get('pages_written', '?')} pages"
                                   for r in dump["rounds"])
                streamed = (f"; pages streamed {lazy.get('pages_arrived')}/{lazy.get('pages_expected')}, all "
                            f"arrived {lazy.get('all_pages_s')} s after the restore began ({lazy.get('state')}"
                            + (f": {lazy.get('error')}; the pause is the source's resumption, not a move)"
                               if lazy.get("state") != "complete" else ")")
                            if lazy else "")
                print(f"trial {number}, {mode}: pause {result['pause']:.3f} s, from {result['where'][0]:+.3f} s after "
                      f"the checkpoint call began to {result['where'][1]:+.3f} s after the restore call returned "
                      f"(checkpoint call "
                      f"{result['checkpoint call']:.3f} s, restore call {result['restore call']:.3f} s, image "
                      f"{result['image bytes'] / 2**20:.1f} MiB); agent recorded {dump['mode']}: {rounds}; CRIU "
                      f"frozen {dump['frozen_ms']} ms{streamed}"
                      + (f"; plain because: {dump['plain_because']}" if dump.get("plain_because") else ""),
                      flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nprocess holding {args.mib} MiB, dirtying {args.dirty:.0%} of it per second; {args.trials} trials "
          f"each, the rows alternated; {os.cpu_count()} CPUs, load average {min(loads):.1f} to {max(loads):.1f}")
    print(f"{'median':36} {'pause':>8} {'checkpoint':>11} {'restore':>8}  dumps as the agent recorded them")
    for mode, rows in results.items():
        modes = sorted({r["dump"]["mode"] for r in rows})
        print(f"{mode:36} {statistics.median(r['pause'] for r in rows):7.3f}s "
              f"{statistics.median(r['checkpoint call'] for r in rows):10.3f}s "
              f"{statistics.median(r['restore call'] for r in rows):7.3f}s  {', '.join(modes)}")
    lazy_rows = results.get("lazy (lazy_pages)") or []
    moved = [r["pause"] for r in lazy_rows if r["lazy"].get("state") == "complete"]
    if len(moved) < len(lazy_rows):
        print(f"lazy moves whose stream failed (the workload resumed on the source): {len(lazy_rows) - len(moved)}")
    if not moved:
        return 1
    lazy_pause = statistics.median(moved)
    print(f"target: pause <= 1 s: lazy {lazy_pause:.3f} s ({'met' if lazy_pause <= 1 else 'MISSED'})")
    return 0 if lazy_pause <= 1 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=1024, help="memory the process holds (MiB)")
    parser.add_argument("--trials", type=int, default=None, help="trials; the figures are medians (15, --pause 3)")
    parser.add_argument("--dir", default=None, help="folder for images and the plain I/O (default: a temp folder)")
    parser.add_argument("--pause", action="store_true", help="the pause of a move, with and without pre-dumps")
    parser.add_argument("--dirty", type=float, default=0.05, help="--pause: share of its memory dirtied per second")
    parser.add_argument("--rows", default="with,plain,lazy",
                        help="--pause: the rows, by their first word (with: pre-dumps, plain, lazy)")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("criu") is None:
        print("bench/checkpoint.py needs root and CRIU 4: run scripts/build-criu.sh as root", file=sys.stderr)
        return 2
    if args.pause:
        args.trials = args.trials or 3
        return pause_main(args)
    args.trials = args.trials or 15

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
