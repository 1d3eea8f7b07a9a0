"""The Ed25519 key that signs evidence heads. It never lives in the database.

From ``GPUSWEEP_EVIDENCE_KEY`` (the PEM text of a private key, or the base64 of its 32-byte seed)
or ``GPUSWEEP_EVIDENCE_KEY_FILE`` (a PEM file); in DEBUG, when neither is set, a key is generated
once under ``var/`` (mode 0600). Someone who can rewrite the database cannot sign again, so an
export checked with the public key (``manage.py evidence_key`` prints it) shows any rewrite.
"""

from __future__ import annotations

import base64
import functools
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from campaigns import verify
from gpusweep.env import write_once


def _from_text(text: str, where: str) -> Ed25519PrivateKey:
    data = text.strip().encode()
    try:
        if b"BEGIN" in data:
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data, validate=True))
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where}: not an Ed25519 private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"{where}: the key is not an Ed25519 key")
    return key


def _generate(path: Path) -> Ed25519PrivateKey:
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    # Web and workers starting together agree on one key, and none reads it half-written.
    written = write_once(path, pem)
    return key if written == pem else _from_text(written.decode(), str(path))


@functools.lru_cache(maxsize=1)
def private_key() -> Ed25519PrivateKey:
    inline = os.environ.get("GPUSWEEP_EVIDENCE_KEY", "").strip()
    if inline:
        return _from_text(inline, "GPUSWEEP_EVIDENCE_KEY")
    path = str(getattr(settings, "GPUSWEEP_EVIDENCE_KEY_FILE", "") or "")
    if path:
        file = Path(path)
        if file.exists():
            return _from_text(file.read_text(), path)
        if getattr(settings, "GPUSWEEP_EVIDENCE_KEY_GENERATE", False):
            return _generate(file)
        raise ImproperlyConfigured(f"GPUSWEEP_EVIDENCE_KEY_FILE={path} does not exist")
    raise ImproperlyConfigured("evidence signing needs GPUSWEEP_EVIDENCE_KEY or GPUSWEEP_EVIDENCE_KEY_FILE "
                               "when DEBUG is off")


def public_key_pem() -> str:
    return private_key().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def key_id() -> str:
    return verify.key_id(private_key().public_key())


def sign(message: bytes) -> str:
    return base64.b64encode(private_key().sign(message)).decode()
