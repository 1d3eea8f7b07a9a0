"""The agent's HTTP API under /v1 (docs/agent-wire-format.md), on the standard library's server."""

from __future__ import annotations

import json
import logging
import os
import re
import socketserver
import ssl
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from . import transfer
from .agent import Agent
from .artifacts import ArtifactError
from .auth import AuthError, verify
from .operations import OperationConflict
from .replay import ReplayError

log = logging.getLogger(__name__)
MAX_BODY = 1024 * 1024
POST_KINDS = {"/v1/checkpoint": "checkpoint", "/v1/restore": "restore", "/v1/patch": "patch",
              "/v1/reboot": "reboot", "/v1/maintenance": "maintenance", "/v1/workloads": "register",
              "/v1/share": "share", "/v1/fetch": "fetch",
              "/v1/health-checks": "health_check", "/v1/rollback": "rollback"}
OPERATION_RE = re.compile(r"^/v1/operations/([^/]+)$")
CHECKPOINT_RE = re.compile(r"^/v1/checkpoints/([^/]+)$")
TRANSFER_RE = re.compile(r"^/v1/transfer/([^/]+)/(.+)$")
LAZY_REPORT_RE = re.compile(r"^/v1/lazy/([^/]+)/report$")
KUBELET_ARCHIVE_RE = re.compile(r"^/v1/kubelet-checkpoints/([^/]+)$")


class AgentServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], agent: Agent) -> None:
        self.agent = agent
        super().__init__(address, Handler)
        config = agent.config
        if config.tls_cert:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(config.tls_cert, config.tls_key)
            if config.tls_client_ca:
                context.load_verify_locations(config.tls_client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
            # The handshake happens in the request thread, so one slow client cannot stall accept().
            self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A refused TLS handshake is the client's problem, not a traceback for the agent's log.
        log.info("connection from %s failed: %s", client_address, sys.exc_info()[1])


class UnixAgentServer(socketserver.ThreadingUnixStreamServer):
    """The same API on a Unix socket (setting ``socket``). Requests are signed with the node key as on the
    TCP port; the socket is open to every local user for that reason (a workload pod's user is the site's)."""

    daemon_threads = True

    def __init__(self, path: str, agent: Agent) -> None:
        self.agent = agent
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).unlink(missing_ok=True)  # the previous agent process's socket
        super().__init__(path, UnixHandler)
        os.chmod(path, 0o666)

    def server_close(self) -> None:
        super().server_close()
        Path(str(self.server_address)).unlink(missing_ok=True)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.info("connection on %s failed: %s", self.server_address, sys.exc_info()[1])


class Handler(BaseHTTPRequestHandler):
    server: AgentServer | UnixAgentServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: with Nagle, a kept-alive connection waits for a delayed ACK (40 ms) at the end
    # of each answer, which made a checkpoint of 20 small images take a second longer to fetch.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authenticate(self, body: bytes) -> bool:
        agent = self.server.agent
        try:
            signed = verify(agent.config.key, dict(self.headers.items()), self.command, self.path, body)
            if signed.identity != agent.config.identity:
                raise AuthError(f"signed for {signed.identity}, this is {agent.config.identity}")
            agent.nonces.claim(signed)
        except (AuthError, ReplayError) as exc:
            self._send(HTTPStatus.UNAUTHORIZED, {"error": str(exc)})
            return False
        return True

    def _body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "body too large"})
            return None
        return self.rfile.read(length) if length else b""

    def _transfer(self, checkpoint_id: str, name: str) -> None:
        """A shared checkpoint's file, for the one receiver holding the token (transfer.py)."""
        agent = self.server.agent
        if not agent.shares.allows(self.headers.get(transfer.TOKEN_HEADER, ""), checkpoint_id):
            self._send(HTTPStatus.UNAUTHORIZED, {"error": f"no valid transfer token for {checkpoint_id}"})
            return
        try:
            path = transfer.served_file(agent.artifacts, checkpoint_id, unquote(name))
            size = path.stat().st_size
        except (ArtifactError, OSError) as exc:
            self._send(HTTPStatus.NOT_FOUND, {"error": str(exc)})
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with path.open("rb") as fh:
            # sendfile(2) from the page cache to the socket (over TLS, the ssl module sends in blocks).
            self.connection.sendfile(fh, 0, size)

    def _kubelet_archive(self, quoted: str) -> None:
        """One of the kubelet's checkpoint archives (``checkpoint-*.tar`` in ``kubelet_checkpoint_dir``, nothing
        else there or elsewhere), for gpusweep to build its checkpoint image."""
        name = unquote(quoted)
        folder = self.server.agent.config.kubelet_checkpoint_dir
        path = folder / name
        if "/" in name or not re.fullmatch(r"checkpoint-[^/]+\.tar", name) or not path.is_file():
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no kubelet checkpoint archive {name!r} in {folder}"})
            return
        size = path.stat().st_size
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with path.open("rb") as fh:
            self.connection.sendfile(fh, 0, size)

    def do_GET(self) -> None:
        if self._body() is None:
            return
        if match := TRANSFER_RE.match(self.path.split("?", 1)[0]):
            self._transfer(match.group(1), match.group(2))
            return
        if not self._authenticate(b""):
            return
        agent = self.server.agent
        path = self.path.split("?", 1)[0]
        if match := KUBELET_ARCHIVE_RE.match(path):
            self._kubelet_archive(match.group(1))
            return
        try:
            if path == "/v1/health":
                self._send(HTTPStatus.OK, agent.health())
            elif path == "/v1/facts":
                self._send(HTTPStatus.OK, agent.facts())
            elif path == "/v1/workloads":
                self._send(HTTPStatus.OK, {"workloads": agent.list_workloads()})
            elif path == "/v1/gpu-users":
                self._send(HTTPStatus.OK, {"gpu_users": agent.gpu_users()})
            elif match := OPERATION_RE.match(path):
                record = agent.operations.get(match.group(1))
                if record is None:
                    self._send(HTTPStatus.NOT_FOUND, {"error": f"no operation {match.group(1)}"})
                else:
                    self._send(HTTPStatus.OK, agent.operations.public(record))
            elif match := CHECKPOINT_RE.match(path):
                try:
                    checkpoint_id = match.group(1)
                    lazy = agent.lazy_status(checkpoint_id)
                    self._send(HTTPStatus.OK, {**agent.artifacts.manifest(checkpoint_id),
                                               **agent.artifacts.restoration(checkpoint_id),
                                               **({"lazy": lazy} if lazy else {})})
                except ArtifactError as exc:
                    self._send(HTTPStatus.NOT_FOUND, {"error": str(exc)})
            else:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such resource {path}"})
        except Exception as exc:
            log.exception("GET %s", path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})

    def _lazy_report(self, checkpoint_id: str, body: bytes) -> None:
        """A lazy move's receiver reporting to this source (agent.py, two-phase release), with the share's token."""
        agent = self.server.agent
        if not agent.shares.allows(self.headers.get(transfer.TOKEN_HEADER, ""), checkpoint_id):
            self._send(HTTPStatus.UNAUTHORIZED, {"error": f"no valid transfer token for {checkpoint_id}"})
            return
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            self._send(HTTPStatus.OK, agent.lazy_report(checkpoint_id, str(data.get("state") or ""),
                                                        str(data.get("node") or "")))
        except LookupError as exc:
            self._send(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except ValueError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": f"{self.path}: {exc}"})

    def do_POST(self) -> None:
        body = self._body()
        if body is None:
            return
        if match := LAZY_REPORT_RE.match(self.path.split("?", 1)[0]):
            self._lazy_report(unquote(match.group(1)), body)
            return
        if not self._authenticate(body):
            return
        kind = POST_KINDS.get(self.path.split("?", 1)[0])
        if kind is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such resource {self.path}"})
            return
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError("expected a JSON object")
            if not data.get("operation_id"):
                raise ValueError("operation_id is required")
            record, _created = self.server.agent.submit(kind, data)
        except OperationConflict as exc:
            self._send(HTTPStatus.CONFLICT, {"error": str(exc)})
            return
        except ValueError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": f"{self.path}: {exc}"})
            return
        public = self.server.agent.operations.public(record)
        finished = public["state"] in ("succeeded", "failed")
        # A repeated id answers like the first call would now: 200 once finished, 202 while running.
        self._send(HTTPStatus.OK if finished else HTTPStatus.ACCEPTED, public)


class UnixHandler(Handler):
    # No TCP on a Unix socket: no Nagle to turn off, and a peer without an address.
    disable_nagle_algorithm = False

    def address_string(self) -> str:
        return "unix-socket"
