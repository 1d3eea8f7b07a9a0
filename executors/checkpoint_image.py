"""A kubelet checkpoint archive as the OCI image CRI-O and containerd 2.x restore from, pushed to a registry.

The layout is checkpointctl's and buildah's (``buildah from scratch; buildah add <archive> /; buildah config
--annotation=io.kubernetes.cri-o.annotations.checkpoint.name=<container>``, the Kubernetes "Forensic container
checkpointing" post): one layer holding the archive's contents (``config.dump``, ``spec.dump``,
``checkpoint/`` ...; the archive is itself an uncompressed tar, so it is the layer as it stands) and the
annotation naming the container, which is how the runtime tells a checkpoint image from an ordinary one
(CRI-O reads ``io.kubernetes.cri-o.annotations.checkpoint.name``, containerd 2.x and checkpointctl
``org.criu.checkpoint.container.name``; both are set).

The layer is the archive's file as it lies on the worker's disk (fetched from the node's agent into a
temporary file, or under ``kubelet_checkpoint_root``): its digest is computed reading it in chunks, and it
is uploaded in chunks, so a checkpoint of many GiB never sits in the worker's memory (``CHUNK``, 8 MiB,
bounds it). The push is the OCI distribution API (v1.1): a chunked blob upload (``POST
/v2/<name>/blobs/uploads/``, a ``PATCH <location>`` per chunk with its ``Content-Range``, each answer's
``Location`` the next, then ``PUT <location>?digest=``) for the layer and the config unless the registry
has them (``HEAD``), then ``PUT /v2/<name>/manifests/<tag>``. Credentials: basic auth, or a registry token
service's bearer token (the ``WWW-Authenticate: Bearer realm=...`` challenge, as Docker Hub, Harbor and
distribution's token auth answer).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_NAME = "io.kubernetes.cri-o.annotations.checkpoint.name"  # CRI-O
CRIU_CONTAINER_NAME = "org.criu.checkpoint.container.name"  # containerd 2.x, checkpointctl
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 8 * 1024 * 1024  # what of a layer is in memory at once: read, hashed, uploaded


class RegistryError(Exception):
    """The registry could not be reached or refused the push."""


@dataclass(frozen=True)
class Blob:
    """A blob of the image: small ones (config, manifest) in memory, the layer in its file (`path`)."""

    media_type: str
    digest: str
    size: int
    data: bytes = b""
    path: Path | None = None

    @classmethod
    def of(cls, media_type: str, data: bytes) -> Blob:
        return cls(media_type, f"sha256:{hashlib.sha256(data).hexdigest()}", len(data), data)

    @classmethod
    def of_file(cls, media_type: str, path: Path, chunk: int = CHUNK) -> Blob:
        """The file's blob, its digest computed one chunk at a time."""
        digest, size = hashlib.sha256(), 0
        with path.open("rb") as source:
            while part := source.read(chunk):
                digest.update(part)
                size += len(part)
        return cls(media_type, f"sha256:{digest.hexdigest()}", size, path=path)

    def chunks(self, chunk: int = CHUNK) -> Iterator[bytes]:
        if self.path is None:
            yield from (self.data[at:at + chunk] for at in range(0, self.size, chunk))
            return
        with self.path.open("rb") as source:
            while part := source.read(chunk):
                yield part

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class CheckpointImage:
    layer: Blob
    config: Blob
    manifest: Blob


def build(archive: Path, container: str, annotations: dict[str, str] | None = None,
          chunk: int = CHUNK) -> CheckpointImage:
    """The OCI image of the kubelet's `archive` of `container`; its layer is the archive's file, read when pushed
    (so the file must stay until then)."""
    layer = Blob.of_file(LAYER, archive, chunk)
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    notes = {CHECKPOINT_NAME: container, CRIU_CONTAINER_NAME: container,
             "org.opencontainers.image.created": created, **(annotations or {})}
    config = Blob.of(CONFIG, json.dumps({
        "created": created, "architecture": "amd64", "os": "linux",
        "config": {"Labels": notes},
        "rootfs": {"type": "layers", "diff_ids": [layer.digest]},  # uncompressed: the layer is its own diff
        "history": [{"created": created, "created_by": f"gpusweep: kubelet checkpoint archive {archive.name}"}],
    }, sort_keys=True).encode())
    manifest = Blob.of(MANIFEST, json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST, "config": config.descriptor(), "layers": [layer.descriptor()],
        "annotations": notes}, sort_keys=True).encode())
    return CheckpointImage(layer=layer, config=config, manifest=manifest)


@dataclass(frozen=True)
class Repository:
    """``[http://|https://]host[:port]/path``: the scheme only for a registry without TLS (https by default)."""

    scheme: str
    host: str
    path: str

    @classmethod
    def parse(cls, text: str) -> Repository:
        scheme = "https"
        match = re.match(r"^(https?)://(.*)$", text.strip())
        if match:
            scheme, text = match.group(1), match.group(2)
        host, _, path = text.strip("/").partition("/")
        if not host or not path or not re.match(r"^[a-z0-9]+(?:[._/-][a-z0-9]+)*$", path):
            raise ValueError(f"checkpoint_image_repository {text!r}: give host[:port]/path (lower case)")
        return cls(scheme, host, path)

    def reference(self, tag: str) -> str:
        """The image reference a pod names (no scheme: the runtime's registry settings decide TLS)."""
        return f"{self.host}/{self.path}:{tag}"


class Registry:
    def __init__(self, repository: Repository, username: str = "", password: str = "", ca_file: str = "",
                 timeout: float = 30.0, chunk: int = CHUNK) -> None:
        self.repository, self.username, self.password, self.timeout = repository, username, password, timeout
        self.chunk = chunk
        self.context = ssl.create_default_context(cafile=ca_file or None) if repository.scheme == "https" else None
        self.token = ""

    def _url(self, path: str) -> str:
        return f"{self.repository.scheme}://{self.repository.host}/v2/{self.repository.path}/{path}"

    def _request(self, method: str, url: str, data: bytes | None = None,
                 headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            elif self.username:
                basic = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
                request.add_header("Authorization", f"Basic {basic}")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                    return response.status, dict(response.headers), response.read()
            except urllib.error.HTTPError as exc:
                challenge = exc.headers.get("WWW-Authenticate", "")
                if exc.code == 401 and attempt == 0 and challenge.lower().startswith("bearer "):
                    self.token = self._bearer(challenge)
                    continue
                return exc.code, dict(exc.headers), exc.read()
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise RegistryError(f"registry {self.repository.host} unreachable: {reason}") from None
        raise RegistryError(f"registry {self.repository.host}: authentication failed")

    def _bearer(self, challenge: str) -> str:
        """A token from the registry's token service, as a Docker client gets one."""
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        query = {k: v for k, v in fields.items() if k in ("service", "scope")}
        query.setdefault("scope", f"repository:{self.repository.path}:pull,push")
        request = urllib.request.Request(f"{fields.get('realm', '')}?{urllib.parse.urlencode(query)}")
        if self.username:
            basic = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {basic}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(f"registry {self.repository.host}: its token service refused: {exc}") from None
        return str(answer.get("token") or answer.get("access_token") or "")

    def _push_blob(self, blob: Blob) -> None:
        status, _, _ = self._request("HEAD", self._url(f"blobs/{blob.digest}"))
        if status == 200:
            return
        status, headers, body = self._request("POST", self._url("blobs/uploads/"), b"")
        location = headers.get("Location") or headers.get("location") or ""
        if status != 202 or not location:
            raise RegistryError(f"registry {self.repository.host} refused an upload: HTTP {status} {body[:300]!r}")
        at = 0
        for part in blob.chunks(self.chunk):
            # Each answer's Location is where the next chunk goes (its upload state may ride in the query).
            url = urllib.parse.urljoin(self._url(""), location)
            status, headers, body = self._request("PATCH", url, part, {
                "Content-Type": "application/octet-stream", "Content-Range": f"{at}-{at + len(part) - 1}"})
            location = headers.get("Location") or headers.get("location") or location
            if status != 202:
                raise RegistryError(f"registry {self.repository.host} refused bytes {at}-{at + len(part) - 1} of "
                                    f"blob {blob.digest}: HTTP {status} {body[:300]!r}")
            at += len(part)
        url = urllib.parse.urljoin(self._url(""), location)
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": blob.digest})
        status, _, body = self._request("PUT", url, b"", {"Content-Type": "application/octet-stream"})
        if status != 201:
            raise RegistryError(f"registry {self.repository.host} refused blob {blob.digest}: HTTP {status} "
                                f"{body[:300]!r}")

    def push(self, image: CheckpointImage, tag: str) -> str:
        """Push `image` as `tag`; its reference by digest (``host/path:tag@sha256:...``)."""
        self._push_blob(image.layer)
        self._push_blob(image.config)
        status, _, body = self._request("PUT", self._url(f"manifests/{tag}"), image.manifest.data,
                                        {"Content-Type": MANIFEST})
        if status != 201:
            raise RegistryError(f"registry {self.repository.host} refused manifest {tag}: HTTP {status} "
                                f"{body[:300]!r}")
        return f"{self.repository.reference(tag)}@{image.manifest.digest}"
