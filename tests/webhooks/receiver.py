"""A local HTTP receiver for webhook tests: checks each signature, can fail the first n requests."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from webhooks.services import verify_signature


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: dict[str, Any]
    signed: bool
    answered: int


@dataclass
class Receiver:
    secret: str
    fail_first: int = 0
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name for the POST handler
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                signed = verify_signature(receiver.secret, self.headers.get("X-Gpusweep-Signature", ""), raw)
                with receiver.lock:
                    failing = len(receiver.requests) < receiver.fail_first
                    status = 401 if not signed else 503 if failing else 200
                    receiver.requests.append(Received(time.monotonic(), dict(self.headers.items()), json.loads(raw),
                                                      signed, status))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"try again")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def delivered(self) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.answered == 200]
