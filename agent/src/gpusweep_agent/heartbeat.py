"""Heartbeats to the service: POST /api/v1/inventory/agent/heartbeat (docs/agent-wire-format.md).

Sent at start and then every interval (the service may ask for another with
``next_heartbeat_s``), each wait jittered by ±10 % so a fleet restarted together spreads out.
After a failure the wait grows exponentially (full jitter) up to ``heartbeat_max_backoff``.

Each heartbeat's nonce is a counter, the microseconds of the clock or one more than the last,
whichever is larger: the service refuses a heartbeat that is not newer than the newest it
accepted (409, a replay), and names that newest so a clock set back does not lock the node out.

Digests: a full heartbeat carries the node's facts and workloads; the service answers with the
digest of that content (``content_digest``). While the content stays the same the agent sends
only the digest (a short heartbeat, which the service answers after one indexed read). When the
service does not hold that digest (it lost it, another source changed the node, the node is new)
it answers ``409 {"send": "full"}`` and the agent sends the full heartbeat at once. A full one
also goes out at least every ``full_every`` seconds, and against a service that answers no
digest (older than digests) every heartbeat is full.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from . import __version__
from .auth import sign
from .util import utcnow
from .workloads import LIVE_STATES

log = logging.getLogger(__name__)
HEARTBEAT_PATH = "/api/v1/inventory/agent/heartbeat"
SCHEMA = "gpusweep.heartbeat/1"
# What a heartbeat reports, and so what its digest covers (not its time or the agent's version).
DIGEST_FIELDS = ("endpoint", "facts", "workloads")
FULL_EVERY_S = 3600.0


def content_digest(payload: dict[str, Any]) -> str:
    """SHA-256 (hex) of a heartbeat's content in canonical JSON; the service computes the same.

    The optional ``os`` object counts only when present, so a heartbeat without one keeps the
    digest it had before the object existed."""
    content = {name: payload.get(name) for name in DIGEST_FIELDS}
    if payload.get("os") is not None:
        content["os"] = payload["os"]
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class HeartbeatError(Exception):
    """A heartbeat was not accepted."""


class HeartbeatUnavailable(HeartbeatError):
    """The service could not be reached or answered 5xx: try again later."""


class HeartbeatAuthError(HeartbeatError):
    """401: the node key or the clock is wrong; retrying will not help until fixed."""


class HeartbeatStale(HeartbeatError):
    """409: the counter was not above the newest the service accepted; the next one will be."""


class HeartbeatFullRequested(HeartbeatError):
    """409 with ``"send": "full"``: the service does not hold this digest; send everything."""


class HeartbeatRejected(HeartbeatError):
    """400: the service refused the payload; `errors` says why."""

    def __init__(self, message: str, errors: Any = None) -> None:
        super().__init__(message)
        self.errors = errors


class HeartbeatSender:
    def __init__(
        self, service_url: str, cluster: str, node: str, key: str, endpoint: str,
        facts: Callable[[], dict[str, Any]], workloads: Callable[[], list[dict[str, Any]]],
        interval: float = 30.0, max_backoff: float = 300.0, timeout: float = 10.0,
        rng: random.Random | None = None, full_every: float = FULL_EVERY_S,
        os_report: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self.url = service_url.rstrip("/") + HEARTBEAT_PATH
        self.cluster, self.node, self.key, self.endpoint = cluster, node, key, endpoint
        self.facts, self.workloads, self.os_report = facts, workloads, os_report
        self.interval, self.max_backoff, self.timeout = interval, max_backoff, timeout
        self.failures = 0
        self.counter = 0
        # The digest the service acknowledged for our last full heartbeat, and when that was sent.
        self.acked_digest: str | None = None
        self.full_every = full_every
        self.full_sent_at = 0.0
        self.rng = rng or random.Random()
        self._stop = threading.Event()

    def payload(self) -> dict[str, Any]:
        # Only work that occupies the node: a migrated workload's record stays behind on the source
        # node, and reporting it would move the workload back and forth in the inventory.
        workloads = [
            {k: v for k, v in w.items() if k not in ("id", "pid", "state")}
            for w in self.workloads() if w.get("state", "running") in LIVE_STATES
        ]
        payload = {"schema": SCHEMA, "cluster": self.cluster, "node": self.node, "agent_version": __version__,
                   "endpoint": self.endpoint, "sent_at": utcnow(), "facts": self.facts(), "workloads": workloads}
        if self.os_report is not None and (os_report := self.os_report()) is not None:
            payload["os"] = os_report
        return payload

    def send(self) -> dict[str, Any]:
        """One heartbeat: the digest alone while the content is what the service acknowledged."""
        payload = self.payload()
        digest = content_digest(payload)
        now = time.monotonic()
        if digest == self.acked_digest and now - self.full_sent_at < self.full_every:
            short = {k: payload[k] for k in ("schema", "cluster", "node", "agent_version", "sent_at")}
            try:
                return self._post({**short, "digest": digest})
            except HeartbeatFullRequested:
                self.acked_digest = None
        answer = self._post({**payload, "digest": digest})
        self.full_sent_at = now
        self.acked_digest = digest if answer.get("digest") == digest else None
        return answer

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(payload).encode()
        parts = urlsplit(self.url)
        # One clock reading for counter and timestamp, so the timestamp (in microseconds) never
        # exceeds the counter: a version 1 copy of this request is then never newer than it.
        now = time.time()
        self.counter = max(self.counter + 1, int(now * 1_000_000))
        headers = {"Content-Type": "application/json",
                   **sign(self.key, f"{self.cluster}/{self.node}", "POST", parts.path, body, now=now,
                          nonce=str(self.counter))}
        request = urllib.request.Request(self.url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                answer: dict[str, Any] = json.loads(response.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:2000]
            try:
                parsed = json.loads(detail or b"null")
            except ValueError:
                parsed = detail.decode(errors="replace")
            if exc.code == 401:
                raise HeartbeatAuthError(f"heartbeat refused (401): {parsed}") from None
            if exc.code == 409 and isinstance(parsed, dict) and parsed.get("send") == "full":
                raise HeartbeatFullRequested(f"heartbeat: the service asks for a full one: {parsed}") from None
            if exc.code == 409:
                newest = parsed.get("newest_counter") if isinstance(parsed, dict) else None
                if isinstance(newest, int):
                    self.counter = max(self.counter, newest)
                raise HeartbeatStale(f"heartbeat refused (409): {parsed}") from None
            if exc.code == 400:
                errors = parsed.get("errors") if isinstance(parsed, dict) else parsed
                raise HeartbeatRejected(f"heartbeat rejected (400): {errors}", errors) from None
            raise HeartbeatUnavailable(f"heartbeat: HTTP {exc.code} {parsed}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise HeartbeatUnavailable(f"heartbeat to {self.url}: {exc}") from None

    def next_delay(self, answer: dict[str, Any] | None) -> float:
        """Seconds until the next heartbeat: the interval ±10 % after success, backoff after failure."""
        if answer is not None:
            self.failures = 0
            base = float(answer.get("next_heartbeat_s") or self.interval)
            return base * self.rng.uniform(0.9, 1.1)
        self.failures += 1
        ceiling = min(self.max_backoff, min(self.interval, 1.0) * 2 ** self.failures)
        return self.rng.uniform(ceiling / 2, ceiling)

    def run(self) -> None:
        while not self._stop.is_set():
            answer: dict[str, Any] | None = None
            try:
                answer = self.send()
            except HeartbeatError as exc:
                log.warning("%s", exc)
            self._stop.wait(self.next_delay(answer))

    def stop(self) -> None:
        self._stop.set()
