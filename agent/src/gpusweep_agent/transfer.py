"""Checkpoint images from agent to agent, for nodes that share no folder.

The service asks the node that holds a checkpoint to share it with one other node (``share``: a
random token, kept here only as its SHA-256, for that checkpoint, that receiver and
``TOKEN_TTL_S``), then asks the receiver to fetch it (``fetch``: the token, the holder's endpoint,
and the image digest the service recorded when the checkpoint was taken). The receiver reads the
manifest and every file from the holder (``GET /v1/transfer/<checkpoint>/<file>`` with the token
in ``X-Gpusweep-Transfer``), checks the manifest against the recorded digest and each file's size
and SHA-256 against the manifest, and only then puts the folder in place in its own store, where
``gpusweep-run`` finds it pending. Nothing half-fetched is ever restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .artifacts import MANIFEST, ArtifactError, LocalArtifactStore, sha256_file
from .util import read_json, write_json_atomic

TOKEN_HEADER = "X-Gpusweep-Transfer"
TOKEN_TTL_S = 3600.0


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


def _open(source: str, checkpoint_id: str, name: str, token: str, timeout: float) -> Any:
    url = f"{source.rstrip('/')}/v1/transfer/{checkpoint_id}/{quote(name)}"
    request = urllib.request.Request(url, headers={TOKEN_HEADER: token})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise TransferError(f"{url}: HTTP {exc.code} {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TransferError(f"{url}: {exc}") from None


def _chunks(response: Any, size: int = 4 * 1024 * 1024) -> Iterator[bytes]:
    while chunk := response.read(size):
        yield chunk


def fetch(store: LocalArtifactStore, checkpoint_id: str, source: str, token: str, digest: str,
          timeout: float = 60.0) -> dict[str, Any]:
    """Copy a checkpoint from the agent at `source` into `store`, checked; return its manifest."""
    final = store.image_dir(checkpoint_id)
    if (final / MANIFEST).is_file():
        manifest = store.verify(checkpoint_id)
        if image_digest(manifest) != digest:
            raise TransferError(f"checkpoint {checkpoint_id} here differs from the one recorded")
        return manifest  # fetched already (or the folder is shared after all)
    with _open(source, checkpoint_id, MANIFEST, token, timeout) as response:
        manifest = json.loads(response.read())
    if not isinstance(manifest, dict) or manifest.get("checkpoint_id") != checkpoint_id:
        raise TransferError(f"the manifest {source} sent is not checkpoint {checkpoint_id}'s")
    if image_digest(manifest) != digest:
        raise TransferError(f"the manifest {source} sent for {checkpoint_id} does not match the image digest "
                            "recorded at the checkpoint")
    partial = final.with_name(f".{checkpoint_id}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for entry in manifest.get("files", []):
            rel = str(entry["path"])
            target = (partial / rel).resolve()
            if partial.resolve() not in target.parents:
                raise TransferError(f"checkpoint {checkpoint_id}: file path {rel!r} leaves the image folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            with _open(source, checkpoint_id, rel, token, timeout) as response, target.open("wb") as out:
                for chunk in _chunks(response):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if target.stat().st_size != int(entry["size"]) or sha256_file(target) != entry["sha256"]:
                raise TransferError(f"checkpoint {checkpoint_id}: {rel} arrived with another size or SHA-256 than "
                                    "its manifest says")
        shutil.rmtree(final, ignore_errors=True)  # a folder left without its manifest by a crash
        partial.rename(final)
        # The manifest last: until it is there, nothing counts the folder as a checkpoint.
        write_json_atomic(final / MANIFEST, manifest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return store.verify(checkpoint_id)
