"""The artifact store that holds checkpoint images, and the manifest beside each.

``<store>/<checkpoint_id>/`` holds the engine's files and ``manifest.json``: the workload, the
engine, the size and SHA-256 of every file, the creation time and the compatibility fingerprint.
A local or shared folder is the only store built; the interface (`ArtifactStore`) is what an
object store would implement. A checkpoint is claimed once by its restorer (an exclusive
``claim.json``), so two restores of one checkpoint cannot both run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

from .util import read_json, utcnow, write_json_atomic

MANIFEST = "manifest.json"
CLAIM = "claim.json"
RESTORED = "restored.json"
SCHEMA = "gpusweep.checkpoint/1"
# What must match between the node a checkpoint was taken on and the restore target.
FINGERPRINT_KEYS = ("gpu_model", "driver", "cuda", "engine", "engine_version", "model_name", "model_version")
# A lazy move's mailbox in a store both agents share (agent.py, lazy moves): the receiver's report, the
# source's decision on its frozen copy.
LAZY_REPORT = "lazy-report.json"
LAZY_DECISION = "lazy-decision.json"
CONTROL_FILES = {MANIFEST, CLAIM, RESTORED, LAZY_REPORT, LAZY_DECISION}


class ArtifactError(Exception):
    """A checkpoint is missing, corrupted, or already claimed."""


def new_checkpoint_id() -> str:
    return f"ck-{uuid.uuid4().hex[:20]}"


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fsync_tree(folder: Path) -> None:
    """Flush every file under `folder` to stable storage, then the folders that name them."""
    folders = [folder]
    for path in sorted(folder.rglob("*")):
        if path.is_dir():
            folders.append(path)
        elif path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for directory in reversed(folders):
        _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fingerprint(facts: dict[str, Any], workload: dict[str, Any]) -> dict[str, str]:
    components = facts.get("components", {})
    return {
        "gpu_model": str(facts.get("gpu_model", "")),
        "driver": str(components.get("driver", "")),
        "cuda": str(components.get("cuda", "")),
        "engine": str(workload.get("engine", "")),
        "engine_version": str(workload.get("engine_version", "")),
        "model_name": str(workload.get("model_name", "")),
        "model_version": str(workload.get("model_version", "")),
    }


def fingerprint_differences(recorded: dict[str, Any], target: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        key: {"checkpoint": str(recorded.get(key, "")), "target": str(target.get(key, ""))}
        for key in FINGERPRINT_KEYS
        if str(recorded.get(key, "")) != str(target.get(key, ""))
    }


def requirement_differences(requires: dict[str, Any], facts: dict[str, Any]) -> dict[str, dict[str, str]]:
    """How this node's facts differ from what a checkpoint needs of its target.

    `requires` comes from the service (its portability rule per checkpoint engine) when the
    checkpoint was taken: {"must": {fact: value}, "if_reported": {fact: value}}, a fact being
    "gpu_model" or a component name; "" means the target must not have it.
    """
    have = {**{str(k): str(v) for k, v in (facts.get("components") or {}).items()},
            "gpu_model": str(facts.get("gpu_model", ""))}
    found: dict[str, dict[str, str]] = {}
    for key, wanted in (requires.get("must") or {}).items():
        if have.get(str(key), "") != str(wanted):
            found[str(key)] = {"checkpoint": str(wanted), "target": have.get(str(key), "")}
    for key, wanted in (requires.get("if_reported") or {}).items():
        there = have.get(str(key), "")
        if there and there != str(wanted):
            found[str(key)] = {"checkpoint": str(wanted), "target": there}
    return found


class GrowingFileHasher:
    """Hashes CRIU's page images while CRIU is still writing them.

    CRIU appends to ``pages-*.img`` sequentially, so the bytes below a file's current size are
    final: hashing them as they arrive overlaps the (large) hashing with the dump, and the manifest
    costs little once the dump ends. A digest is used only when the file's inode and final size
    match what was hashed; anything else is hashed again from the start.
    """

    def __init__(self, folder: Path, pattern: str = "**/pages-*.img", chunk: int = 4 * 1024 * 1024) -> None:
        self.folder, self.pattern, self.chunk = folder, pattern, chunk
        self._files: dict[str, tuple[int, int, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="image-hasher", daemon=True)

    def __enter__(self) -> GrowingFileHasher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        # The workload is frozen until CRIU is done: hashing takes what CPU the dump leaves.
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass
        while True:
            stopping = self._stop.is_set()
            progressed = self._step()
            if stopping and not progressed:
                return
            if not progressed:
                self._stop.wait(0.01)

    def _step(self) -> bool:
        progressed = False
        if not self.folder.is_dir():
            return False
        # "**" takes in the pre-dump rounds' folders (engines/criu.py), never following their `parent` links.
        try:
            paths = list(self.folder.glob(self.pattern))
        except OSError:
            # A folder removed while it was listed (a failed pre-dump's rounds go before the plain dump):
            # list again on the next pass; an exception here would end the thread, and the hashing with it.
            return True
        for path in paths:
            rel = path.relative_to(self.folder).as_posix()
            try:
                with path.open("rb") as fh:
                    st = os.fstat(fh.fileno())
                    ino, offset, digest = self._files.get(rel, (st.st_ino, 0, None))
                    if digest is None or ino != st.st_ino:
                        ino, offset, digest = st.st_ino, 0, hashlib.sha256()
                    fh.seek(offset)
                    while offset < st.st_size:
                        block = fh.read(min(self.chunk, st.st_size - offset))
                        if not block:
                            break
                        digest.update(block)
                        offset += len(block)
                        progressed = True
                    self._files[rel] = (ino, offset, digest)
            except FileNotFoundError:
                continue
        return progressed

    def digests(self) -> dict[str, tuple[int, int, str]]:
        """path in the folder -> (inode, size hashed, sha256), once the hasher has stopped."""
        return {name: (ino, size, digest.hexdigest()) for name, (ino, size, digest) in self._files.items()}


class ArtifactStore:
    """Where checkpoint images live. Subclass for an object store."""

    def image_dir(self, checkpoint_id: str) -> Path:
        raise NotImplementedError

    def make_durable(self, checkpoint_id: str) -> None:
        """Put the images on stable storage: the node may be patched and rebooted next."""
        raise NotImplementedError

    def write_manifest(self, checkpoint_id: str, manifest: dict[str, Any]) -> None:
        raise NotImplementedError

    def manifest(self, checkpoint_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def verify(self, checkpoint_id: str) -> dict[str, Any]:
        raise NotImplementedError

    def claim(self, checkpoint_id: str, by: str) -> None:
        raise NotImplementedError

    def release(self, checkpoint_id: str) -> None:
        raise NotImplementedError

    def claimed_by(self, checkpoint_id: str) -> str | None:
        """Who holds the restore claim on a checkpoint (None when nobody does)."""
        raise NotImplementedError

    def mark_restored(self, checkpoint_id: str, info: dict[str, Any]) -> None:
        raise NotImplementedError

    def pending_for(self, workload_id: str) -> str | None:
        raise NotImplementedError

    def restoration(self, checkpoint_id: str) -> dict[str, Any]:
        """Who claimed the checkpoint and who restored it (None each while nobody has)."""
        raise NotImplementedError


class LocalArtifactStore(ArtifactStore):
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def image_dir(self, checkpoint_id: str) -> Path:
        if not checkpoint_id.startswith("ck-") or "/" in checkpoint_id or ".." in checkpoint_id:
            raise ArtifactError(f"bad checkpoint id {checkpoint_id!r}")
        return self.root / checkpoint_id

    def build_manifest(
        self, checkpoint_id: str, workload: dict[str, Any], engine: str, fp: dict[str, str], extra: dict[str, Any],
        hashed: dict[str, tuple[int, int, str]] | None = None,
    ) -> dict[str, Any]:
        """The manifest of the folder as it is now; `hashed` holds digests taken while it was written."""
        folder = self.image_dir(checkpoint_id)
        files = []
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if rel in CONTROL_FILES:
                continue
            st = path.stat()
            early = (hashed or {}).get(rel)
            digest = early[2] if early and early[:2] == (st.st_ino, st.st_size) else sha256_file(path)
            files.append({"path": rel, "size": st.st_size, "sha256": digest})
        return {
            "schema": SCHEMA, "checkpoint_id": checkpoint_id, "workload": workload, "engine": engine,
            "created_at": utcnow(), "files": files, "total_bytes": sum(f["size"] for f in files),
            "fingerprint": fp, "engine_data": extra,
        }

    def make_durable(self, checkpoint_id: str) -> None:
        # The page cache would lose them to a crash or a forced reboot, with the workload already stopped.
        fsync_tree(self.image_dir(checkpoint_id))

    def write_manifest(self, checkpoint_id: str, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.image_dir(checkpoint_id) / MANIFEST, manifest)
        _fsync_dir(self.image_dir(checkpoint_id))  # the rename into place, too

    def manifest(self, checkpoint_id: str) -> dict[str, Any]:
        path = self.image_dir(checkpoint_id) / MANIFEST
        try:
            data = read_json(path)
        except ValueError as exc:
            raise ArtifactError(f"checkpoint {checkpoint_id}: manifest unreadable ({exc})") from None
        if not isinstance(data, dict):
            raise ArtifactError(f"checkpoint {checkpoint_id}: no manifest in {path.parent}")
        return data

    def verify(self, checkpoint_id: str) -> dict[str, Any]:
        """Check every file's size and SHA-256 against the manifest; raise with the list of problems."""
        manifest = self.manifest(checkpoint_id)
        folder = self.image_dir(checkpoint_id)
        problems: list[str] = []
        listed = set()
        for entry in manifest.get("files", []):
            listed.add(entry["path"])
            path = folder / entry["path"]
            if not path.is_file():
                problems.append(f"{entry['path']}: missing")
            elif path.stat().st_size != entry["size"]:
                problems.append(f"{entry['path']}: size {path.stat().st_size} != {entry['size']}")
            elif sha256_file(path) != entry["sha256"]:
                problems.append(f"{entry['path']}: sha256 differs from the manifest")
        for path in folder.rglob("*"):
            rel = path.relative_to(folder).as_posix()
            if path.is_file() and rel not in listed and rel not in CONTROL_FILES:
                problems.append(f"{rel}: not in the manifest")
        if problems:
            raise ArtifactError(f"checkpoint {checkpoint_id} is corrupted: " + "; ".join(sorted(problems)))
        return manifest

    def claim(self, checkpoint_id: str, by: str) -> None:
        path = self.image_dir(checkpoint_id) / CLAIM
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            holder = read_json(path, {}) or {}
            raise ArtifactError(
                f"checkpoint {checkpoint_id} is already being restored or was restored by {holder.get('by', '?')}"
            ) from None
        with os.fdopen(fd, "w") as fh:
            fh.write(f'{{"by": "{by}", "at": "{utcnow()}"}}')

    def release(self, checkpoint_id: str) -> None:
        (self.image_dir(checkpoint_id) / CLAIM).unlink(missing_ok=True)

    def claimed_by(self, checkpoint_id: str) -> str | None:
        path = self.image_dir(checkpoint_id) / CLAIM
        if not path.exists():
            return None
        return str((read_json(path, {}) or {}).get("by", "?"))

    def mark_restored(self, checkpoint_id: str, info: dict[str, Any]) -> None:
        write_json_atomic(self.image_dir(checkpoint_id) / RESTORED, info)

    def restoration(self, checkpoint_id: str) -> dict[str, Any]:
        folder = self.image_dir(checkpoint_id)
        out: dict[str, Any] = {}
        for key, name in (("claimed", CLAIM), ("restored", RESTORED)):
            try:
                out[key] = read_json(folder / name, None)
            except ValueError:  # the claim is being written: it exists, its content follows
                out[key] = {}
        return out

    def pending_for(self, workload_id: str) -> str | None:
        """The newest complete, unclaimed checkpoint of `workload_id`, if any."""
        best: tuple[str, str] | None = None
        for manifest_path in self.root.glob(f"*/{MANIFEST}"):
            folder = manifest_path.parent
            if (folder / CLAIM).exists() or (folder / RESTORED).exists():
                continue
            data = read_json(manifest_path, {}) or {}
            if data.get("workload", {}).get("id") == workload_id:
                key = (str(data.get("created_at", "")), folder.name)
                if best is None or key > best:
                    best = key
        return best[1] if best else None

    def discard(self, checkpoint_id: str) -> None:
        shutil.rmtree(self.image_dir(checkpoint_id), ignore_errors=True)
