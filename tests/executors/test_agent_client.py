"""The agent client against an HTTP server that checks signatures with the agent's own auth code.

The server is a stand-in for the node agent (a fake): the real agent in agent/ does not serve
its API yet. It implements only what the client's contract needs: signature checks with
``gpusweep_agent.auth.verify``, operation ids that are idempotent, 202 then polling.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from gpusweep_agent.auth import AuthError, derive_node_key, verify

from executors.agent_client import AgentClient
from executors.base import NodeRef, PermanentExecutorError, TemporaryExecutorError
from executors.local import LocalExecutor
from tests.helpers import free_port

SECRET = "fleet-secret-for-tests"


class StandIn(BaseHTTPRequestHandler):
    operations: dict[str, dict[str, Any]] = {}
    executed: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authenticated(self, body: bytes) -> bool:
        try:
            verify(derive_node_key(SECRET, "c", "n1"), dict(self.headers), self.command, self.path, body)
        except AuthError as exc:
            self._answer(401, {"error": str(exc)})
            return False
        return True

    def do_GET(self) -> None:
        if not self._authenticated(b""):
            return
        if self.path.startswith("/v1/operations/"):
            op = self.operations[self.path.rsplit("/", 1)[1]]
            op["state"] = "succeeded" if op["kind"] != "patch-fails" else "failed"
            self._answer(200, op)
        elif self.path == "/v1/health":
            self._answer(200, {"status": "ok", "node": "c/n1", "maintenance": False})
        elif self.path == "/v1/facts":
            self._answer(200, {"components": {"driver": "570.195.03"}})
        else:
            self._answer(404, {"error": "no such path"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self._authenticated(body):
            return
        request = json.loads(body)
        op_id = request["operation_id"]
        if op_id not in self.operations:
            self.executed.append(op_id)
            kind = "patch-fails" if request.get("version") == "bad" else self.path
            self.operations[op_id] = {
                "id": op_id, "kind": kind, "state": "running", "error": "dpkg failed",
                "result": {"before": "570.86.15", "after": request.get("version")},
            }
        self._answer(202, self.operations[op_id])


@pytest.fixture
def agent() -> Iterator[str]:
    StandIn.operations, StandIn.executed = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_it_signs_polls_and_repeats_nothing_for_one_operation_id(agent: str):
    ex = LocalExecutor(None, secret=SECRET)
    node = NodeRef(cluster="c", name="n1", endpoint=agent)
    first = ex.patch(node, "driver", "570.195.03", "op-1")
    again = ex.patch(node, "driver", "570.195.03", "op-1")
    assert first.after == again.after == "570.195.03"
    assert StandIn.executed == ["op-1"]
    assert ex.verify(node).healthy


def test_a_failed_operation_is_permanent(agent: str):
    ex = LocalExecutor(None, secret=SECRET)
    with pytest.raises(PermanentExecutorError, match="dpkg failed"):
        ex.patch(NodeRef(cluster="c", name="n1", endpoint=agent), "driver", "bad", "op-2")


def test_a_wrong_key_is_refused_permanently(agent: str):
    client = AgentClient(agent, "c", "n1", secret="another-secret")
    with pytest.raises(PermanentExecutorError, match="401"):
        client.get("/v1/health")


def test_an_agent_that_does_not_answer_is_temporary():
    client = AgentClient(f"http://127.0.0.1:{free_port()}", "c", "n1", secret=SECRET, request_timeout=1)
    with pytest.raises(TemporaryExecutorError):
        client.get("/v1/health")


def test_an_agent_that_dies_in_the_middle_of_its_answer_is_temporary():
    """An agent restarting for a reboot can close the connection after its headers: http.client's
    IncompleteRead (no OSError) must be a temporary error, which the operation's polling rides out."""

    class HalfAnswer(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "191")
            self.end_headers()
            self.wfile.write(b'{"state": ')
            self.wfile.flush()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), HalfAnswer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = AgentClient(f"http://127.0.0.1:{server.server_address[1]}", "c", "n1", secret=SECRET,
                             request_timeout=2)
        with pytest.raises(TemporaryExecutorError, match="IncompleteRead"):
            client.get("/v1/operations/x")
    finally:
        server.shutdown()
