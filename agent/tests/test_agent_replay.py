"""Nonces in signatures (auth.py) and the agent's memory of them (replay.py), without processes."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import pytest
from gpusweep_agent.auth import (
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_SIGNATURE_2,
    MAX_SKEW_SECONDS,
    AuthError,
    Signed,
    derive_node_key,
    sign,
    verify,
)
from gpusweep_agent.replay import NonceLog, ReplayError

KEY = derive_node_key("fleet", "c", "n1")


def test_the_nonce_is_signed_and_a_request_without_one_needs_legacy():
    headers = sign(KEY, "c/n1", "GET", "/v1/health", b"")
    signed = verify(KEY, headers, "GET", "/v1/health", b"")
    assert signed == Signed("c/n1", int(headers["X-Gpusweep-Timestamp"]), headers[HEADER_NONCE])
    with pytest.raises(AuthError, match="bad signature"):
        verify(KEY, {**headers, HEADER_NONCE: "0" * 32}, "GET", "/v1/health", b"")
    version_1 = {k: v for k, v in headers.items() if k not in (HEADER_NONCE, HEADER_SIGNATURE_2)}
    with pytest.raises(AuthError, match="unsigned nonce"):
        verify(KEY, version_1, "GET", "/v1/health", b"")
    assert verify(KEY, version_1, "GET", "/v1/health", b"", legacy=True).nonce == ""


def test_signers_still_send_version_1_for_receivers_older_than_nonces():
    """The version 1 signature, computed here as docs/agent-wire-format.md gave it before nonces."""
    body = b'{"operation_id": "x"}'
    headers = sign(KEY, "c/n1", "POST", "/v1/patch", body, now=1_800_000_000)
    string = f"1800000000\nPOST\n/v1/patch\n{hashlib.sha256(body).hexdigest()}".encode()
    assert headers[HEADER_SIGNATURE] == hmac.new(KEY.encode(), string, hashlib.sha256).hexdigest()


def test_a_nonce_is_refused_while_its_request_could_pass_the_clock_check(tmp_path: Path):
    log = NonceLog(tmp_path / "nonces.log")
    now = time.time()
    first = Signed("c/n1", int(now), "abc")
    log.claim(first, now=now)
    with pytest.raises(ReplayError, match="replayed"):
        log.claim(first, now=now + MAX_SKEW_SECONDS)
    # Once the timestamp is outside the window the clock check refuses it; the nonce may go.
    log.claim(first, now=now + MAX_SKEW_SECONDS + 2)


def test_the_log_survives_a_restart_and_drops_what_expired(tmp_path: Path):
    path = tmp_path / "nonces.log"
    now = time.time()
    log = NonceLog(path)
    log.claim(Signed("c/n1", int(now), "fresh"), now=now)
    log.claim(Signed("c/n1", int(now) - 2 * MAX_SKEW_SECONDS, "expired"), now=now)
    with path.open("a") as handle:
        handle.write("12")  # a line cut short by a crash
    reopened = NonceLog(path)
    with pytest.raises(ReplayError):
        reopened.claim(Signed("c/n1", int(now), "fresh"), now=now)
    assert "expired" not in path.read_text() and "fresh" in path.read_text()
