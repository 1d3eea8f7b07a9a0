"""Checkpoint images fetched from agent to agent when the nodes share no folder (transfer.py), through
two real agents, each with its own store: only the token's holder reads the files, and whatever does
not match the manifest's SHA-256 (or a manifest that does not match the recorded digest) never lands."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_helpers import CLUSTER, AgentProcess
from gpusweep_agent.transfer import TOKEN_HEADER, image_digest

CHECKPOINT = "ck-0123456789abcdef0123"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[AgentProcess, AgentProcess, Path, Path]]:
    stores = tmp_path / "store-a", tmp_path / "store-b"
    a, b = AgentProcess(tmp_path, "a", stores[0]).start(), AgentProcess(tmp_path, "b", stores[1]).start()
    try:
        yield a, b, stores[0], stores[1]
    finally:
        a.stop()
        b.stop()


def make_checkpoint(store: Path) -> dict[str, object]:
    """A sealed checkpoint folder as an engine leaves it: two image files and their manifest."""
    folder = store / CHECKPOINT
    (folder / "sub").mkdir(parents=True)
    files: list[dict[str, object]] = []
    total = 0
    for rel, data in (("pages-1.img", os.urandom(300_000)), ("sub/core.img", b"core" * 1000)):
        (folder / rel).write_bytes(data)
        files.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        total += len(data)
    manifest = {"schema": "gpusweep.checkpoint/1", "checkpoint_id": CHECKPOINT, "workload": {"id": "w-1"},
                "engine": "criu", "files": files, "total_bytes": total}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def get(agent: AgentProcess, path: str, token: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{agent.port}{path}", headers={TOKEN_HEADER: token})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_checkpoint_travels_to_the_receiver_with_its_token_checked_file_by_file(pair) -> None:  # type: ignore[no-untyped-def]
    a, b, store_a, store_b = pair
    manifest = make_checkpoint(store_a)
    share = a.client.call("/v1/share", "share-1", checkpoint_id=CHECKPOINT, to=f"{CLUSTER}/b")
    assert share["state"] == "succeeded", share
    token = share["result"]["token"]
    assert get(a, f"/v1/transfer/{CHECKPOINT}/pages-1.img", "not-the-token") == 401
    assert get(a, f"/v1/transfer/{CHECKPOINT}/../../etc/passwd", token) in (401, 404)
    assert get(a, f"/v1/transfer/{CHECKPOINT}/pages-1.img", token) == 200
    assert not list((store_a / CHECKPOINT).glob("*token*")) and token not in json.dumps(
        [json.loads(p.read_text()) for p in (a.state / "shares").iterdir()])

    source = f"http://127.0.0.1:{a.port}"
    # A manifest that is not the one the service recorded at the checkpoint is refused.
    wrong = b.client.call("/v1/fetch", "fetch-wrong", checkpoint_id=CHECKPOINT, source=source, token=token,
                          sha256="0" * 64)
    assert wrong["state"] == "failed" and "digest" in wrong["error"]
    # A file changed at the source after the manifest was sealed: refused, nothing lands.
    (store_a / CHECKPOINT / "pages-1.img").write_bytes(os.urandom(300_000))
    tampered = b.client.call("/v1/fetch", "fetch-tampered", checkpoint_id=CHECKPOINT, source=source, token=token,
                             sha256=image_digest(manifest))
    assert tampered["state"] == "failed" and "SHA-256" in tampered["error"], tampered
    assert not (store_b / CHECKPOINT).exists() and not [p for p in store_b.iterdir() if "partial" in p.name]

    (store_a / CHECKPOINT).rename(store_a / "gone")
    make_checkpoint(store_a)  # the same id sealed again: a new manifest, a new digest
    fresh = json.loads((store_a / CHECKPOINT / "manifest.json").read_text())
    done = b.client.call("/v1/fetch", "fetch-ok", checkpoint_id=CHECKPOINT, source=source, token=token,
                         sha256=image_digest(fresh))
    assert done["state"] == "succeeded", done
    for rel in ("pages-1.img", "sub/core.img"):
        assert (store_b / CHECKPOINT / rel).read_bytes() == (store_a / CHECKPOINT / rel).read_bytes()
    assert json.loads((store_b / CHECKPOINT / "manifest.json").read_text()) == fresh
    assert b.client.get(f"/v1/checkpoints/{CHECKPOINT}")["claimed"] is None, "fetched, pending for its restore"


def seal_large(store: Path) -> dict[str, object]:
    """A sealed checkpoint whose pages file spans several of the receiver's blocks, and small images."""
    folder = store / CHECKPOINT
    folder.mkdir(parents=True)
    files: list[dict[str, object]] = []
    for rel, data in (("pages-1.img", os.urandom(9 * 1024 * 1024 + 123)), ("core-1.img", b"core" * 500),
                      ("mm-1.img", b"mm" * 300), ("empty.img", b"")):
        (folder / rel).write_bytes(data)
        files.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"schema": "gpusweep.checkpoint/1", "checkpoint_id": CHECKPOINT, "workload": {"id": "w-1"},
                "engine": "criu", "files": files, "total_bytes": sum(int(f["size"]) for f in files)}  # type: ignore[call-overload]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def nothing_kept(store: Path) -> bool:
    return not (store / CHECKPOINT).exists() and not [p for p in store.iterdir() if "partial" in p.name]


def test_a_corrupted_grown_or_cut_file_is_refused_and_nothing_half_written_is_kept(pair) -> None:  # type: ignore[no-untyped-def]
    a, b, store_a, store_b = pair
    manifest = seal_large(store_a)
    token = a.client.call("/v1/share", "share-2", checkpoint_id=CHECKPOINT, to=f"{CLUSTER}/b")["result"]["token"]
    fetch = {"checkpoint_id": CHECKPOINT, "source": f"http://127.0.0.1:{a.port}", "token": token,
             "sha256": image_digest(manifest)}
    pages = store_a / CHECKPOINT / "pages-1.img"
    good = pages.read_bytes()
    # One byte flipped in the middle of the large file (its third block): the stream's hash differs.
    pages.write_bytes(good[:8_000_000] + bytes([good[8_000_000] ^ 1]) + good[8_000_001:])
    flipped = b.client.call("/v1/fetch", "fetch-flipped", **fetch)
    assert flipped["state"] == "failed" and "pages-1.img arrived with another SHA-256" in flipped["error"], flipped
    assert nothing_kept(store_b)
    # Longer than the manifest says: refused before the extra bytes are written.
    pages.write_bytes(good + b"x" * 10)
    grown = b.client.call("/v1/fetch", "fetch-grown", **fetch)
    assert grown["state"] == "failed" and "more than the" in grown["error"], grown
    assert nothing_kept(store_b)
    # Cut short.
    pages.write_bytes(good[:5_000_000])
    cut = b.client.call("/v1/fetch", "fetch-cut", **fetch)
    assert cut["state"] == "failed" and "bytes arrived" in cut["error"], cut
    assert nothing_kept(store_b)

    pages.write_bytes(good)
    done = b.client.call("/v1/fetch", "fetch-good", **fetch)
    assert done["state"] == "succeeded", done
    for entry in manifest["files"]:  # type: ignore[attr-defined]
        assert hashlib.sha256((store_b / CHECKPOINT / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]


def test_a_fetched_copy_a_crash_left_corrupted_is_fetched_again_unless_claimed(pair) -> None:  # type: ignore[no-untyped-def]
    """Fetched files are not fsynced (the holder keeps the durable copy): a receiver that crashed may
    find its copy with a manifest and zeroed pages. The next fetch replaces it; a claimed one stays refused."""
    a, b, store_a, store_b = pair
    manifest = seal_large(store_a)
    token = a.client.call("/v1/share", "share-3", checkpoint_id=CHECKPOINT, to=f"{CLUSTER}/b")["result"]["token"]
    fetch = {"checkpoint_id": CHECKPOINT, "source": f"http://127.0.0.1:{a.port}", "token": token,
             "sha256": image_digest(manifest)}
    assert b.client.call("/v1/fetch", "fetch-1", **fetch)["state"] == "succeeded"
    copy = store_b / CHECKPOINT / "pages-1.img"
    copy.write_bytes(bytes(copy.stat().st_size))
    again = b.client.call("/v1/fetch", "fetch-2", **fetch)
    assert again["state"] == "succeeded", again
    assert copy.read_bytes() == (store_a / CHECKPOINT / "pages-1.img").read_bytes()

    copy.write_bytes(bytes(copy.stat().st_size))
    (store_b / CHECKPOINT / "claim.json").write_text('{"by": "test/b"}')
    claimed = b.client.call("/v1/fetch", "fetch-3", **fetch)
    assert claimed["state"] == "failed" and "corrupted" in claimed["error"], claimed
