"""A signed client for one agent's /v1 API (used by gpusweep-run, the tests and the bench)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.request
import uuid
from typing import Any
from urllib.parse import urlsplit

from .auth import sign

# An endpoint "unix:///run/gpusweep-agent/agent.sock": the agent's Unix socket (its setting ``socket``).
UNIX = "unix://"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AgentClientError(Exception):
    """The agent could not be reached or answered with an error."""

    def __init__(self, message: str, status: int = 0, payload: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.payload = payload


class AgentClient:
    def __init__(self, endpoint: str, identity: str, key: str, timeout: float = 30.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.identity = identity
        self.key = key
        self.timeout = timeout
        self.ssl_context = ssl_context

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                signed: bool = True) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        url = self.endpoint + path
        parts = urlsplit(path if self.endpoint.startswith(UNIX) else url)
        headers = {"Content-Type": "application/json"}
        if signed:
            signed_path = parts.path + (f"?{parts.query}" if parts.query else "")
            headers.update(sign(self.key, self.identity, method, signed_path, data))
        if self.endpoint.startswith(UNIX):
            return self._unix_request(method, path, data if body is not None else None, headers)
        request = urllib.request.Request(url, data=data if body is not None else None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.ssl_context) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw or b"null")
            except ValueError:
                return exc.code, {"error": raw.decode(errors="replace")}
        except (urllib.error.URLError, OSError) as exc:
            raise AgentClientError(f"{method} {url}: {exc}") from exc

    def _unix_request(self, method: str, path: str, data: bytes | None,
                      headers: dict[str, str]) -> tuple[int, Any]:
        connection = _UnixConnection(self.endpoint.removeprefix(UNIX), self.timeout)
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            status, raw = response.status, response.read()
        except OSError as exc:
            raise AgentClientError(f"{method} {self.endpoint}{path}: {exc}") from exc
        finally:
            connection.close()
        try:
            return status, json.loads(raw or b"null")
        except ValueError:
            return status, {"error": raw.decode(errors="replace")}

    def get(self, path: str) -> Any:
        status, payload = self.request("GET", path)
        if status != 200:
            raise AgentClientError(f"GET {path}: HTTP {status} {payload}", status, payload)
        return payload

    def submit(self, path: str, operation_id: str | None = None, **fields: Any) -> dict[str, Any]:
        status, payload = self.request("POST", path, {"operation_id": operation_id or uuid.uuid4().hex, **fields})
        if status not in (200, 202):
            raise AgentClientError(f"POST {path}: HTTP {status} {payload}", status, payload)
        op: dict[str, Any] = payload
        return op

    def wait(self, op: dict[str, Any], timeout: float = 600.0, interval: float = 0.1) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while op.get("state") not in ("succeeded", "failed"):
            if time.monotonic() > deadline:
                raise AgentClientError(f"operation {op.get('id')} still {op.get('state')} after {timeout:.0f} s")
            time.sleep(interval)
            op = self.get(f"/v1/operations/{op['id']}")
        return op

    def call(self, path: str, operation_id: str | None = None, timeout: float = 600.0, **fields: Any) -> dict[str, Any]:
        """Submit and wait; return the finished operation (succeeded or failed)."""
        return self.wait(self.submit(path, operation_id, **fields), timeout)
