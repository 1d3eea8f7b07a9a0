"""Request signing shared by the agent and the service (standard library only).

Each node has its own key, derived from one fleet secret that only the service holds:
``node_key = HMAC-SHA256(fleet_secret, "gpusweep-node-key:" + cluster + "/" + node)``. The
service derives keys on demand (nothing stored); a node is given its key once at provisioning
(``manage.py agent_key CLUSTER NODE``). Requests in both directions carry

    X-Gpusweep-Node: <cluster>/<node>
    X-Gpusweep-Timestamp: <unix seconds>
    X-Gpusweep-Signature: hex HMAC-SHA256(node_key, "<ts>\\n<METHOD>\\n<path?query>\\n<sha256(body) hex>")

and are refused (401) when the signature differs or the timestamp is more than
MAX_SKEW_SECONDS away from the receiver's clock, so a captured request cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

MAX_SKEW_SECONDS = 300
HEADER_NODE = "X-Gpusweep-Node"
HEADER_TIMESTAMP = "X-Gpusweep-Timestamp"
HEADER_SIGNATURE = "X-Gpusweep-Signature"


class AuthError(Exception):
    """The request is unauthenticated, stale or signed with the wrong key."""


def derive_node_key(fleet_secret: str, cluster: str, node: str) -> str:
    if not fleet_secret:
        raise AuthError("no fleet secret configured")
    message = f"gpusweep-node-key:{cluster}/{node}".encode()
    return hmac.new(fleet_secret.encode(), message, hashlib.sha256).hexdigest()


def _string_to_sign(timestamp: str, method: str, path: str, body: bytes) -> bytes:
    return f"{timestamp}\n{method.upper()}\n{path}\n{hashlib.sha256(body).hexdigest()}".encode()


def sign(key: str, identity: str, method: str, path: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """Headers that authenticate one request. `path` includes the query string."""
    timestamp = str(int(now if now is not None else time.time()))
    signature = hmac.new(key.encode(), _string_to_sign(timestamp, method, path, body), hashlib.sha256).hexdigest()
    return {HEADER_NODE: identity, HEADER_TIMESTAMP: timestamp, HEADER_SIGNATURE: signature}


def verify(
    key: str, headers: Mapping[str, str], method: str, path: str, body: bytes, now: float | None = None
) -> str:
    """Return the caller's identity ("cluster/node") or raise AuthError."""
    lowered = {k.lower(): v for k, v in headers.items()}
    identity = lowered.get(HEADER_NODE.lower(), "")
    timestamp = lowered.get(HEADER_TIMESTAMP.lower(), "")
    signature = lowered.get(HEADER_SIGNATURE.lower(), "")
    if not (identity and timestamp and signature):
        raise AuthError("missing authentication headers")
    try:
        sent = int(timestamp)
    except ValueError:
        raise AuthError("bad timestamp") from None
    current = now if now is not None else time.time()
    if abs(current - sent) > MAX_SKEW_SECONDS:
        raise AuthError("stale request (timestamp outside the allowed clock skew)")
    expected = hmac.new(key.encode(), _string_to_sign(timestamp, method, path, body), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise AuthError("bad signature")
    return identity
