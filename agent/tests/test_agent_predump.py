"""Pre-dumps before a criu checkpoint (engines/criu.py): rounds while the workload runs, the final
dump on top of the last round, each round recorded, the links between rounds put back before a
restore, and a plain dump (recorded as such) wherever pre-dumps cannot run.

The kernels here and in CI are built without CONFIG_MEM_SOFT_DIRTY, so real CRIU refuses
`pre-dump --track-mem` ("Tracking memory is not available"); the real-CRIU tests
(test_agent_checkpoint.py) check the plain fallback. These tests run the engine against a stand-in
`criu` script that answers `check --feature mem_dirty_track` as a kernel with dirty tracking does
and writes what a (pre-)dump leaves: page images, CRIU's stats-dump image and the `parent` link.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpusweep_agent.artifacts import GrowingFileHasher, LocalArtifactStore
from gpusweep_agent.config import AgentConfig
from gpusweep_agent.engines.criu import CriuEngine, dump_stats

FAKE_CRIU = r'''#!PYTHON
"""A stand-in for criu: what it is asked is appended to CALLS; pages written per round come from PAGES."""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
with open(os.path.join(here, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(args) + "\n")
if args[0] == "--version":
    print("Version: 4.1.1"); sys.exit(0)
if args[0] == "check":
    sys.exit(int(open(os.path.join(here, "check-rc")).read()) if os.path.exists(os.path.join(here, "check-rc")) else 0)
def arg(name):
    return args[args.index(name) + 1] if name in args else None
def varint(n):
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out
folder, log = arg("-D"), arg("-o")
pages = json.load(open(os.path.join(here, "pages.json")))
written = pages.pop(0)
json.dump(pages, open(os.path.join(here, "pages.json"), "w"))
if args[0] == "pre-dump" and written < 0:
    open(log, "w").write("Error (criu/mem.c:45): BUG at criu/mem.c:45\n"); sys.exit(134)
if args[0] == "dump" and arg("--prev-images-dir") and os.path.exists(os.path.join(here, "parent-fails")):
    open(os.path.join(folder, "pages-1.img"), "wb").write(b"half")
    open(log, "w").write("Error (criu/page-xfer.c:1): Can't open parent\n"); sys.exit(1)
open(os.path.join(folder, "pages-1.img"), "wb").write(b"p" * written * 16)
open(os.path.join(folder, "pagemap-42.img"), "wb").write(b"m" * 10)
if arg("--prev-images-dir"):
    os.symlink(arg("--prev-images-dir"), os.path.join(folder, "parent"))
entry = b"".join(varint(k << 3) + varint(v) for k, v in ((1, 900), (2, 5000 + written), (5, 9999), (7, written)))
body = varint(1 << 3 | 2) + varint(len(entry)) + entry
magic = b"\x40\x59\x10\x55\x06\x33\x09\x57"
open(os.path.join(folder, "stats-dump"), "wb").write(magic + len(body).to_bytes(4, "little") + body)
open(log, "w").write("Dumping finished successfully\n" if args[0] == "dump" else "Pre-dumping finished successfully\n")
'''


@pytest.fixture
def criu(tmp_path: Path) -> Iterator[tuple[CriuEngine, Path, Path]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "criu"
    script.write_text(FAKE_CRIU.replace("PYTHON", sys.executable))
    script.chmod(0o755)
    config = AgentConfig(node="n", key="k", state_dir=tmp_path / "state", artifact_dir=tmp_path / "store",
                         criu=str(script), criu_pre_dumps=3)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield CriuEngine(config), bin_dir, tmp_path / "store" / "ck-0123456789abcdef0123"
    finally:
        sleeper.kill()
        sleeper.wait()


def run_checkpoint(engine: CriuEngine, bin_dir: Path, image_dir: Path, pages: list[int]) -> dict:  # type: ignore[type-arg]
    (bin_dir / "pages.json").write_text(json.dumps(pages))
    workload = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        with GrowingFileHasher(image_dir) as hasher:
            data = engine.checkpoint({"id": "w", "pid": workload.pid}, image_dir, False, lambda **_: None)
        workload.wait(5)  # stopped by the engine once the dump was complete
    finally:
        workload.kill()
    assert set(hasher.digests()) >= {"pages-1.img", *(f"pre-{r['round']}/pages-1.img" for r in data["dump"]["rounds"]
                                                       if r["kind"] == "pre-dump")}
    return data


def calls(bin_dir: Path) -> list[list[str]]:
    return [json.loads(line) for line in (bin_dir / "calls.jsonl").read_text().splitlines()]


def test_it_pre_dumps_until_little_changes_then_dumps_on_top_of_the_last_round(criu) -> None:  # type: ignore[no-untyped-def]
    engine, bin_dir, image_dir = criu
    # 262,144 pages (1 GiB), then 13,000 dirtied (5% a second), then 1,500: enough; the dump writes 700.
    data = run_checkpoint(engine, bin_dir, image_dir, [262_144, 13_000, 1_500, 700])
    dump = data["dump"]
    assert dump["mode"] == "pre-dump" and "plain_because" not in dump
    assert [(r["round"], r["kind"], r["pages_written"]) for r in dump["rounds"]] == [
        (1, "pre-dump", 262_144), (2, "pre-dump", 13_000), (3, "pre-dump", 1_500), (4, "dump", 700)]
    assert dump["frozen_ms"] == 5.7  # CRIU's frozen_time of the final dump, 5,700 us
    steps = [c for c in calls(bin_dir) if c[0] in ("pre-dump", "dump")]
    assert [c[0] for c in steps] == ["pre-dump", "pre-dump", "pre-dump", "dump"]
    assert all("--track-mem" in c for c in steps)
    assert "--prev-images-dir" not in steps[0]
    assert [c[c.index("--prev-images-dir") + 1] for c in steps[1:]] == ["../pre-1", "../pre-2", "pre-3"]
    assert dump["parents"] == {"pre-2": "../pre-1", "pre-3": "../pre-2", "": "pre-3"}
    # An agent that died between the dump and the manifest finds the links again when it recovers.
    assert engine.recover({"id": "w", "pid": 0}, image_dir, {"log": str(engine.log_path(image_dir, "dump"))})
    assert engine.recovered["dump"]["parents"] == dump["parents"]

    # A copy of the files alone (as an agent fetches it) has no links; the restore puts them back.
    store = LocalArtifactStore(image_dir.parent)
    manifest = store.build_manifest(image_dir.name, {"id": "w"}, "criu", {}, data)
    assert {f["path"] for f in manifest["files"]} >= {"pages-1.img", "pre-1/pages-1.img", "pre-3/stats-dump"}
    copy = image_dir.parent / "copy" / image_dir.name
    for entry in manifest["files"]:
        (copy / entry["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image_dir / entry["path"], copy / entry["path"])
    assert not (copy / "parent").exists()
    engine.restore_args(manifest, copy, image_dir.parent / "work")
    assert (copy / "parent").resolve() == (copy / "pre-3").resolve()
    assert (copy / "pre-2" / "parent").resolve() == (copy / "pre-1").resolve()
    assert dump_stats(copy / "pre-2") == {"freezing_us": 900, "frozen_us": 18_000, "pages_scanned": 9999,
                                           "pages_written": 13_000}


def test_it_stops_pre_dumping_when_the_workload_dirties_as_fast_as_it_is_copied(criu) -> None:  # type: ignore[no-untyped-def]
    engine, bin_dir, image_dir = criu
    data = run_checkpoint(engine, bin_dir, image_dir, [262_144, 150_000, 100_000, 90_000])
    assert [r["kind"] for r in data["dump"]["rounds"]] == ["pre-dump", "pre-dump", "dump"]


def test_it_dumps_plainly_and_says_why_without_dirty_tracking_or_when_a_round_fails(criu) -> None:  # type: ignore[no-untyped-def]
    engine, bin_dir, image_dir = criu
    (bin_dir / "check-rc").write_text("1")
    data = run_checkpoint(engine, bin_dir, image_dir, [262_144])
    assert data["dump"]["mode"] == "plain" and data["dump"]["parents"] == {}
    assert data["dump"]["plain_because"].startswith("criu check --feature mem_dirty_track: exit 1")
    assert [c[0] for c in calls(bin_dir) if c[0] in ("pre-dump", "dump")] == ["dump"]

    (bin_dir / "check-rc").unlink()
    engine = CriuEngine(dataclasses.replace(engine.config, criu=str(bin_dir / "criu2")))
    shutil.copy(bin_dir / "criu", bin_dir / "criu2")  # another binary: its own check
    other = image_dir.with_name("ck-0123456789abcdef0124")
    data = run_checkpoint(engine, bin_dir, other, [262_144, -1, 262_144])
    dump = data["dump"]
    assert dump["mode"] == "plain" and "round 2 failed (exit 134)" in dump["plain_because"], dump
    assert not [p for p in other.iterdir() if p.name.startswith("pre-")], "the rounds of a failed pre-dump are gone"

    # The dump on top of the pre-dumps fails (the workload thawed, as CRIU leaves it): once more, plainly.
    (bin_dir / "parent-fails").write_text("1")
    third = image_dir.with_name("ck-0123456789abcdef0125")
    dump = run_checkpoint(engine, bin_dir, third, [262_144, 1_000, 700, 262_144])["dump"]
    assert dump["mode"] == "plain" and "dump on the pre-dumps failed (exit 1)" in dump["plain_because"], dump
    assert [r["pages_written"] for r in dump["rounds"]] == [262_144] and dump["parents"] == {}
    assert not [p for p in third.iterdir() if p.name.startswith("pre-") or p.name == "parent"]
    assert (third / "pages-1.img").stat().st_size == 262_144 * 16
