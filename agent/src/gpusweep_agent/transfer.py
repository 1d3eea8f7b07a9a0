"""Checkpoint images from agent to agent, for nodes that share no folder.

The service asks the node that holds a checkpoint to share it with one other node (``share``: a
random token, kept here only as its SHA-256, for that checkpoint, that receiver and
``TOKEN_TTL_S``), then asks the receiver to fetch it (``fetch``: the token, the holder's endpoint,
and the image digest the service recorded when the checkpoint was taken). The receiver reads the
manifest and every file from the holder (``GET /v1/transfer/<checkpoint>/<file>`` with the token
in ``X-Gpusweep-Transfer``), checks the manifest against the recorded digest and each file's size
and SHA-256 against the manifest, and only then puts the folder in place in its own store, where
``gpusweep-run`` finds it pending. Nothing half-fetched is ever restored.

At wire speed (bench/transfer.py): the holder sends each file with ``sendfile`` (no copy through
Python); the receiver fetches several files at once on kept-alive connections, reads large blocks
and hashes each block on a second thread while the next one arrives, so the SHA-256 costs no extra
pass over the file. Fetched files are not fsynced: the holder's copy is the durable one (fsynced
when the checkpoint was taken) until the restore, and a copy a crash cut short fails verification
and is fetched again.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import queue
import secrets
import shutil
import ssl
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, quote, urlsplit

from .artifacts import CONTROL_FILES, MANIFEST, ArtifactError, LocalArtifactStore
from .util import read_json, write_json_atomic

TOKEN_HEADER = "X-Gpusweep-Transfer"
TOKEN_TTL_S = 3600.0
# Files fetched at once (a CRIU image is one large pages file and many small ones), the block each
# read fills, and the blocks in flight between the socket and the hashing thread.
WORKERS = 4
BLOCK = 4 * 1024 * 1024
BUFFERS = 4
MAX_MANIFEST = 64 * 1024 * 1024


class TransferError(Exception):
    pass


def image_digest(manifest: dict[str, Any]) -> str:
    """The image's identity: the hash over its files' hashes, in manifest order (as the service records it)."""
    return hashlib.sha256("".join(str(f.get("sha256", "")) for f in manifest.get("files") or []).encode()).hexdigest()


class Shares:
    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "shares"

    def grant(self, checkpoint_id: str, to: str) -> dict[str, Any]:
        token = secrets.token_urlsafe(32)
        self.folder.mkdir(parents=True, exist_ok=True)
        expires = time.time() + TOKEN_TTL_S
        write_json_atomic(self.folder / f"{hashlib.sha256(token.encode()).hexdigest()}.json",
                          {"checkpoint_id": checkpoint_id, "to": to, "expires": expires})
        return {"token": token, "checkpoint_id": checkpoint_id, "to": to, "expires": expires}

    def allows(self, token: str, checkpoint_id: str) -> bool:
        if not token:
            return False
        grant = read_json(self.folder / f"{hashlib.sha256(token.encode()).hexdigest()}.json", None)
        return isinstance(grant, dict) and grant.get("checkpoint_id") == checkpoint_id and \
            float(grant.get("expires") or 0) > time.time()


def served_file(store: LocalArtifactStore, checkpoint_id: str, name: str) -> Path:
    """The file of a checkpoint a receiver may read: its manifest or a file the manifest lists."""
    folder = store.image_dir(checkpoint_id)
    if name == MANIFEST:
        return folder / MANIFEST
    listed = {str(f["path"]) for f in store.manifest(checkpoint_id).get("files", [])}
    if name not in listed:
        raise ArtifactError(f"checkpoint {checkpoint_id} has no file {name!r}")
    return folder / name


def connect(parts: SplitResult, timeout: float) -> http.client.HTTPConnection:
    """An HTTP(S) connection to another agent's endpoint (https: the system's trust store)."""
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout,
                                           context=ssl.create_default_context())
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)


class _Source:
    """Keep-alive HTTP connections to the holder, one per worker thread (files in parallel)."""

    def __init__(self, source: str, checkpoint_id: str, token: str, timeout: float) -> None:
        parts = urlsplit(source)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransferError(f"bad source endpoint {source!r}")
        self.source, self.parts, self.checkpoint_id = source.rstrip("/"), parts, checkpoint_id
        self.token, self.timeout = token, timeout
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.parts, self.timeout)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def get(self, name: str) -> http.client.HTTPResponse:
        """The holder's answer for one file of the checkpoint, its body not read yet."""
        path = f"{self.parts.path.rstrip('/')}/v1/transfer/{self.checkpoint_id}/{quote(name)}"
        url = f"{self.source}/v1/transfer/{self.checkpoint_id}/{quote(name)}"
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("GET", path, headers={TOKEN_HEADER: self.token})
                response = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                # A kept-alive connection the holder closed meanwhile: once more on a fresh one.
                self.close()
                if attempt == 2:
                    raise TransferError(f"{url}: {exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                raise TransferError(f"{url}: {exc}") from None
        if response.status != 200:
            detail = response.read(300)
            self.close()
            raise TransferError(f"{url}: HTTP {response.status} {detail!r}")
        return response


def _stream(response: http.client.HTTPResponse, out: Any, size: int, stop: threading.Event) -> str:
    """Copy the body into `out` in large blocks, hashing each block on a second thread while the
    next one arrives; return the SHA-256. More bytes than `size` is an error (nothing trusts a length
    the holder announced)."""
    free: queue.Queue[bytearray] = queue.Queue()
    for _ in range(BUFFERS):
        free.put(bytearray(BLOCK))
    filled: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
    digest = hashlib.sha256()

    def hash_blocks() -> None:
        while (item := filled.get()) is not None:
            block, count = item
            digest.update(memoryview(block)[:count])  # hashlib lets go of the GIL on large blocks
            free.put(block)

    hasher = threading.Thread(target=hash_blocks, name="transfer-hash", daemon=True)
    hasher.start()
    received = 0
    try:
        while not stop.is_set():
            block = free.get()
            view = memoryview(block)
            count = 0
            while count < BLOCK and (n := response.readinto(view[count:])):
                count += n
            if not count:
                break
            received += count
            if received > size:
                raise TransferError(f"more than the {size} bytes the manifest lists")
            written = 0
            while written < count:
                written += out.write(view[written:count])
            filled.put((block, count))
            if count < BLOCK:
                break
    finally:
        filled.put(None)
        hasher.join()
    if stop.is_set():
        raise TransferError("stopped: another file of the checkpoint failed")
    if received != size:
        raise TransferError(f"{received} bytes arrived, the manifest lists {size}")
    return digest.hexdigest()


def _fetch_file(holder: _Source, partial: Path, entry: dict[str, Any], stop: threading.Event) -> None:
    rel = str(entry["path"])
    target = partial / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    response = holder.get(rel)
    try:
        with target.open("wb", buffering=0) as out:
            sha256 = _stream(response, out, int(entry["size"]), stop)
    except (OSError, http.client.HTTPException) as exc:
        holder.close()
        raise TransferError(f"{holder.checkpoint_id}/{rel}: {exc}") from None
    except TransferError as exc:
        holder.close()
        raise TransferError(f"checkpoint {holder.checkpoint_id}: {rel}: {exc}") from None
    if sha256 != entry["sha256"]:
        raise TransferError(f"checkpoint {holder.checkpoint_id}: {rel} arrived with another SHA-256 than its "
                            "manifest says")


def _fetch_files(holder: _Source, partial: Path, files: list[dict[str, Any]], workers: int) -> None:
    """Every file into `partial`, the largest first, `workers` at a time; the first failure stops the rest."""
    stop = threading.Event()
    todo: queue.Queue[dict[str, Any]] = queue.Queue()
    for entry in sorted(files, key=lambda f: -int(f["size"])):
        todo.put(entry)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            while not stop.is_set():
                try:
                    entry = todo.get_nowait()
                except queue.Empty:
                    return
                _fetch_file(holder, partial, entry, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append(exc)
            stop.set()
        finally:
            holder.close()

    threads = [threading.Thread(target=work, name=f"transfer-{i}", daemon=True)
               for i in range(max(1, min(workers, len(files))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        # The first failure is the cause; the others only noticed the stop.
        raise next((e for e in errors if "another file" not in str(e)), errors[0])


def _checked_paths(checkpoint_id: str, partial: Path, files: list[dict[str, Any]]) -> None:
    """Refuse the whole manifest before any byte is written if one of its paths leaves the folder."""
    root = partial.resolve()
    for entry in files:
        rel = str(entry["path"])
        target = (partial / rel).resolve()
        if root not in target.parents or rel in CONTROL_FILES:
            raise TransferError(f"checkpoint {checkpoint_id}: file path {rel!r} leaves the image folder or names "
                                "one of the store's own files")


def fetch(store: LocalArtifactStore, checkpoint_id: str, source: str, token: str, digest: str,
          timeout: float = 60.0, workers: int = WORKERS) -> dict[str, Any]:
    """Copy a checkpoint from the agent at `source` into `store`, checked; return its manifest."""
    final = store.image_dir(checkpoint_id)
    if (final / MANIFEST).is_file():
        try:
            manifest = store.verify(checkpoint_id)
        except ArtifactError:
            if store.claimed_by(checkpoint_id):
                raise
            # A copy a crash cut short (fetched files are not fsynced; the holder's is the durable
            # copy): fetched again below.
            shutil.rmtree(final)
        else:
            if image_digest(manifest) != digest:
                raise TransferError(f"checkpoint {checkpoint_id} here differs from the one recorded")
            return manifest  # fetched already (or the folder is shared after all)
    holder = _Source(source, checkpoint_id, token, timeout)
    try:
        with holder.get(MANIFEST) as response:
            raw = response.read(MAX_MANIFEST + 1)
        if len(raw) > MAX_MANIFEST:
            raise ValueError(f"over {MAX_MANIFEST} bytes")
        manifest = json.loads(raw)
    except (ValueError, OSError, http.client.HTTPException) as exc:
        raise TransferError(f"the manifest {source} sent for {checkpoint_id} is unreadable: {exc}") from None
    finally:
        holder.close()
    if not isinstance(manifest, dict) or manifest.get("checkpoint_id") != checkpoint_id:
        raise TransferError(f"the manifest {source} sent is not checkpoint {checkpoint_id}'s")
    if image_digest(manifest) != digest:
        raise TransferError(f"the manifest {source} sent for {checkpoint_id} does not match the image digest "
                            "recorded at the checkpoint")
    files = list(manifest.get("files") or [])
    partial = final.with_name(f".{checkpoint_id}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _checked_paths(checkpoint_id, partial, files)
        partial.mkdir(parents=True)
        _fetch_files(holder, partial, files, workers)
        shutil.rmtree(final, ignore_errors=True)  # a folder left without its manifest by a crash
        partial.rename(final)
        # The manifest last: until it is there, nothing counts the folder as a checkpoint.
        write_json_atomic(final / MANIFEST, manifest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    # Every byte was hashed as it arrived (no second pass here); the restore verifies the folder again.
    return manifest


def lazy_report(source: str, checkpoint_id: str, token: str, report: dict[str, Any],
                timeout: float = 3.0) -> dict[str, Any] | None:
    """A receiver's word on a lazy move to the source's agent (POST /v1/lazy/<checkpoint>/report, with the
    share's token): the source's answer ({"decision": "pending"|"released"|"resumed"}), or None when there
    was none (unreachable, refused): the receiver then counts the time without word (agent.py)."""
    parts = urlsplit(source)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    conn = connect(parts, timeout)
    try:
        conn.request("POST", f"{parts.path.rstrip('/')}/v1/lazy/{quote(checkpoint_id)}/report",
                     body=json.dumps(report).encode(), headers={TOKEN_HEADER: token,
                                                                "Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read(10000)
        if response.status != 200:
            return None
        answer = json.loads(body)
        return answer if isinstance(answer, dict) else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()
