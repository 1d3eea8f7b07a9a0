"""Request signing shared by the agent and the service (standard library only).

Each node has its own key, derived from one fleet secret that only the service holds:
``node_key = HMAC-SHA256(fleet_secret, "gpusweep-node-key:" + cluster + "/" + node)``. The
service derives keys on demand (nothing stored); a node is given its key once at provisioning
(``manage.py agent_key CLUSTER NODE``). Requests in both directions carry

    X-Gpusweep-Node: <cluster>/<node>
    X-Gpusweep-Timestamp: <unix seconds>
    X-Gpusweep-Nonce: <a value the signer never used before for this receiver>
    X-Gpusweep-Signature-2: hex HMAC-SHA256(node_key,
        "gpusweep-2\\n<ts>\\n<nonce>\\n<METHOD>\\n<path?query>\\n<sha256(body) hex>")

and are refused (401) when the signature differs or the timestamp is more than
MAX_SKEW_SECONDS away from the receiver's clock. Within that window the nonce stops a replay:
the agent remembers every nonce it accepted until its timestamp leaves the window
(``gpusweep_agent.replay``); the service takes heartbeat nonces as a per-node counter that must
grow (``inventory.agent``), which refuses a replayed heartbeat and an older one alike.

Signers also send version 1, ``X-Gpusweep-Signature`` over the same string without the first
and third lines, for receivers that predate nonces. A receiver that knows nonces refuses a
request without one, except the service from agents that predate them (``legacy=True``), whose
heartbeats are then ordered by their timestamps.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass

MAX_SKEW_SECONDS = 300
HEADER_NODE = "X-Gpusweep-Node"
HEADER_TIMESTAMP = "X-Gpusweep-Timestamp"
HEADER_NONCE = "X-Gpusweep-Nonce"
HEADER_SIGNATURE = "X-Gpusweep-Signature"
HEADER_SIGNATURE_2 = "X-Gpusweep-Signature-2"
NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class AuthError(Exception):
    """The request is unauthenticated, stale, replayed or signed with the wrong key."""


@dataclass(frozen=True)
class Signed:
    """Who signed a request, when, and with which nonce ("" for a version 1 request)."""

    identity: str
    timestamp: int
    nonce: str


def derive_node_key(fleet_secret: str, cluster: str, node: str) -> str:
    if not fleet_secret:
        raise AuthError("no fleet secret configured")
    message = f"gpusweep-node-key:{cluster}/{node}".encode()
    return hmac.new(fleet_secret.encode(), message, hashlib.sha256).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(16)


def _string_to_sign(timestamp: str, method: str, path: str, body: bytes) -> bytes:
    return f"{timestamp}\n{method.upper()}\n{path}\n{hashlib.sha256(body).hexdigest()}".encode()


def _string_to_sign_2(timestamp: str, nonce: str, method: str, path: str, body: bytes) -> bytes:
    return f"gpusweep-2\n{timestamp}\n{nonce}\n{method.upper()}\n{path}\n{hashlib.sha256(body).hexdigest()}".encode()


def _mac(key: str, message: bytes) -> str:
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def sign(key: str, identity: str, method: str, path: str, body: bytes, now: float | None = None,
         nonce: str | None = None) -> dict[str, str]:
    """Headers that authenticate one request. `path` includes the query string; a fresh random
    nonce is drawn unless one is given (heartbeats give their counter)."""
    timestamp = str(int(now if now is not None else time.time()))
    nonce = nonce if nonce is not None else new_nonce()
    if not NONCE_RE.match(nonce):
        raise AuthError(f"bad nonce {nonce!r}: 1 to 64 letters, digits, '-' or '_'")
    return {
        HEADER_NODE: identity,
        HEADER_TIMESTAMP: timestamp,
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE_2: _mac(key, _string_to_sign_2(timestamp, nonce, method, path, body)),
        HEADER_SIGNATURE: _mac(key, _string_to_sign(timestamp, method, path, body)),
    }


def verify(
    key: str, headers: Mapping[str, str], method: str, path: str, body: bytes, now: float | None = None,
    legacy: bool = False,
) -> Signed:
    """Check the signature and the clock; return who signed it, or raise AuthError.

    Replays are the caller's to refuse, by the returned nonce. With `legacy`, a version 1
    request (no nonce) is accepted too, with nonce "".
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    identity = lowered.get(HEADER_NODE.lower(), "")
    timestamp = lowered.get(HEADER_TIMESTAMP.lower(), "")
    nonce = lowered.get(HEADER_NONCE.lower(), "")
    signature_2 = lowered.get(HEADER_SIGNATURE_2.lower(), "")
    signature_1 = lowered.get(HEADER_SIGNATURE.lower(), "")
    if not (identity and timestamp and (signature_2 or signature_1)):
        raise AuthError("missing authentication headers")
    if not signature_2 and not legacy:
        raise AuthError(f"unsigned nonce: send {HEADER_NONCE} and {HEADER_SIGNATURE_2} (a signer older than "
                        "replay protection; upgrade it)")
    try:
        sent = int(timestamp)
    except ValueError:
        raise AuthError("bad timestamp") from None
    current = now if now is not None else time.time()
    if abs(current - sent) > MAX_SKEW_SECONDS:
        raise AuthError("stale request (timestamp outside the allowed clock skew)")
    if signature_2:
        if not NONCE_RE.match(nonce):
            raise AuthError(f"bad or missing {HEADER_NONCE}")
        expected = _mac(key, _string_to_sign_2(timestamp, nonce, method, path, body))
        if not hmac.compare_digest(expected, signature_2):
            raise AuthError("bad signature")
        return Signed(identity, sent, nonce)
    expected = _mac(key, _string_to_sign(timestamp, method, path, body))
    if not hmac.compare_digest(expected, signature_1):
        raise AuthError("bad signature")
    return Signed(identity, sent, "")
