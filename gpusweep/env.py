"""Typed helpers that read settings from the environment and fail loudly on bad values.

Every helper raises ImproperlyConfigured naming the variable, so a typo in a deployment
stops the process at start-up instead of surfacing later as odd behaviour.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
# Every name the service reads for its own settings: a webhook or cluster may never name one
# (gpusweep.secret_env), whatever prefix a deployment allows.
OWN_NAMES: set[str] = set()


def env_str(name: str, default: str | None = None) -> str:
    OWN_NAMES.add(name)
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfigured(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    OWN_NAMES.add(name)
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    OWN_NAMES.add(name)
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    OWN_NAMES.add(name)
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_json_object(name: str) -> dict[str, object]:
    """A JSON object (``{"key": value}``); unset or empty: {}."""
    OWN_NAMES.add(name)
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object ({{\"key\": value, ...}})")
    return value


def env_url(name: str, default: str, *, schemes: set[str]) -> str:
    """A URL whose scheme must be one of `schemes` (checked before anything connects)."""
    OWN_NAMES.add(name)
    value = os.environ.get(name, default).strip()
    scheme = urlsplit(value).scheme
    # "db+postgresql" style prefixes are not accepted: one spelling per engine keeps docs simple.
    if scheme not in schemes:
        allowed = ", ".join(sorted(schemes))
        raise ImproperlyConfigured(f"{name}={value!r}: scheme {scheme!r} is not one of {allowed}")
    return value


def persistent_secret(var_dir: Path, env_name: str, *, generate: bool, min_length: int = 32) -> str:
    """A secret from the environment; when absent and `generate` is true, made once and kept under var/.

    Two processes starting at once (web and worker) must agree on one value (write_once).
    Returns "" when absent and not generated; callers decide whether that is an error.
    """
    OWN_NAMES.add(env_name)
    value = os.environ.get(env_name, "").strip()
    if value:
        if len(value) < min_length:
            raise ImproperlyConfigured(f"{env_name} must be at least {min_length} characters")
        return value
    if not generate:
        return ""
    key_file = var_dir / env_name.lower()
    if key_file.exists():
        return key_file.read_text().strip()
    return write_once(key_file, secrets.token_urlsafe(50).encode()).decode().strip()


def write_once(path: Path, data: bytes) -> bytes:
    """Put `data` at `path` (mode 0600) unless a file is there already; returns what `path` holds.

    Processes starting together (web and workers) must agree on one value and none may read it
    half-written: the data goes whole into a file of its own, then link() places it only where
    nothing is (atomic); whoever loses the race reads the winner's complete file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return path.read_bytes()
    finally:
        os.unlink(tmp)
    return data


def secret_key(var_dir: Path, *, debug: bool) -> str:
    """SECRET_KEY from the environment; in DEBUG, generated once and kept under var/.

    Production must set it: a key that silently changes on every deploy would log
    everybody out and invalidate signed tokens.
    """
    value = persistent_secret(var_dir, "SECRET_KEY", generate=debug)
    if not value:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    return value
