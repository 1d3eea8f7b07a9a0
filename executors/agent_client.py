"""A client for the node agent's HTTP API (docs/agent-wire-format.md), standard library only.

Requests are signed with the node's key, derived on demand from ``GPUSWEEP_AGENT_FLEET_SECRET``
exactly as ``gpusweep_agent.auth.derive_node_key`` does (nothing stored), each with a fresh
nonce, so a captured request sent again is refused by the agent. Mutating calls carry
the caller's operation id, so a retry after a crash returns the first operation; long
operations answer 202 and are polled until they finish or the timeout passes.

Errors map onto the executor errors: no answer, a timeout or a 5xx is temporary (retry the
step); a 4xx, a refused signature or an operation that failed is permanent.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from gpusweep_agent.auth import AuthError, derive_node_key, sign

from executors.base import InterruptedOperation, PermanentExecutorError, TemporaryExecutorError

FLEET_SECRET_ENV = "GPUSWEEP_AGENT_FLEET_SECRET"


def fleet_secret() -> str:
    secret = str(getattr(settings, FLEET_SECRET_ENV, "") or os.environ.get(FLEET_SECRET_ENV, ""))
    if not secret:
        raise PermanentExecutorError(f"{FLEET_SECRET_ENV} is not set; the service cannot sign agent requests")
    return secret


class AgentClient:
    def __init__(
        self, endpoint: str, cluster: str, node: str, *, secret: str | None = None,
        request_timeout: float = 10.0, operation_timeout: float = 600.0, poll_interval: float = 0.2,
    ) -> None:
        if not endpoint:
            raise PermanentExecutorError(f"node {cluster}/{node} has no agent endpoint")
        self.endpoint = endpoint.rstrip("/")
        self.identity = f"{cluster}/{node}"
        try:
            self.key = derive_node_key(secret if secret is not None else fleet_secret(), cluster, node)
        except AuthError as exc:
            raise PermanentExecutorError(str(exc)) from exc
        self.request_timeout = request_timeout
        self.operation_timeout = operation_timeout
        self.poll_interval = poll_interval

    def _answered(self, what: str, code: int, detail: object) -> TemporaryExecutorError | PermanentExecutorError:
        """An agent's error answer as the executor's error: a 5xx or 429 may pass (retry), a 4xx will not."""
        message = f"agent {self.identity} {what}: HTTP {code} {detail}"
        return TemporaryExecutorError(message) if code >= 500 or code == 429 else PermanentExecutorError(message)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else b""
        url = self.endpoint + path
        signed_path = urlsplit(url).path + (f"?{urlsplit(url).query}" if urlsplit(url).query else "")
        headers = {"Content-Type": "application/json", **sign(self.key, self.identity, method, signed_path, data)}
        request = urllib.request.Request(url, data=data if body is not None else None, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                detail: Any = json.loads(payload or b"null")
            except ValueError:
                detail = payload.decode(errors="replace")[:500]
            raise self._answered(f"{method} {path}", exc.code, detail) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as exc:
            # HTTPException: an agent restarting (a reboot) may close the connection mid-answer (IncompleteRead).
            raise TemporaryExecutorError(f"agent {self.identity} {method} {path}: {exc}") from exc

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]

    def download(self, path: str, target: Path) -> None:
        """A file the agent serves (signed GET) into `target`, streamed."""
        url = self.endpoint + path
        headers = sign(self.key, self.identity, "GET", urlsplit(url).path, b"")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=self.request_timeout) as response, target.open("wb") as out:
                shutil.copyfileobj(response, out, 1024 * 1024)
        except urllib.error.HTTPError as exc:
            raise self._answered(f"GET {path}", exc.code, exc.read()[:500].decode(errors="replace")) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, http.client.HTTPException) as exc:
            raise TemporaryExecutorError(f"agent {self.identity} GET {path}: {exc}") from exc

    def operation(self, path: str, operation_id: str, **fields: Any) -> dict[str, Any]:
        """POST a mutating call and wait for its operation to finish; return the operation's result."""
        _status, op = self.request("POST", path, {"operation_id": operation_id, **fields})
        deadline = time.monotonic() + self.operation_timeout
        while op.get("state") not in ("succeeded", "failed"):
            if time.monotonic() > deadline:
                raise TemporaryExecutorError(
                    f"agent {self.identity} operation {operation_id} still {op.get('state')} "
                    f"after {self.operation_timeout:.0f} s"
                )
            time.sleep(self.poll_interval)
            try:
                op = self.get(f"/v1/operations/{op.get('id', operation_id)}")
            except TemporaryExecutorError:
                # The agent restarts during a reboot (or briefly fails): keep polling until the deadline.
                continue
        if op["state"] == "failed":
            message = f"agent {self.identity} {path} {operation_id} failed: {op.get('error')}"
            if isinstance(op.get("result"), dict) and op["result"].get("interrupted"):
                raise InterruptedOperation(message)
            raise PermanentExecutorError(message)
        result = op.get("result") or {}
        return result if isinstance(result, dict) else {"value": result}
