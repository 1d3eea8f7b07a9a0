"""Which environment variables a webhook or a cluster may name as its secret (issue 28, item 1).

An admin-group user writes `authorization_env` and `secret_env`; whatever they name is read from
the service's environment and sent on. So only names the deployment set aside for that are
allowed: those starting with one of GPUSWEEP_SECRET_ENV_PREFIXES (default ``GPUSWEEP_SECRET_``),
and never a name the service reads for itself (its keys, its database and broker settings), even
when a prefix is broad enough to cover one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from django.conf import settings

from gpusweep.env import OWN_NAMES

# Read by the service outside gpusweep.env (signing, the agent fleet, Django itself, libraries).
RESERVED = frozenset({
    "SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DJANGO_SETTINGS_MODULE",
    "GPUSWEEP_EVIDENCE_KEY", "GPUSWEEP_EVIDENCE_KEY_FILE", "GPUSWEEP_AGENT_FLEET_SECRET", "GPUSWEEP_EXECUTOR",
    "GPUSWEEP_CACHE_URL", "GPUSWEEP_HEARTBEAT_REDIS_URL", "GPUSWEEP_METRICS_TOKEN", "GPUSWEEP_EVIDENCE_DIGEST_DIR",
    "GPUSWEEP_SECRET_ENV_PREFIXES", "PGPASSWORD", "PGPASSFILE", "REDIS_URL",
    # boto3's own credentials (the digest object store, campaigns.digests.ObjectLockStore)
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
})


_READERS = frozenset({"env_str", "env_bool", "env_int", "env_list", "env_url", "persistent_secret"})


@functools.cache
def _settings_names() -> frozenset[str]:
    """Every name gpusweep/settings.py reads, also those read only in some configurations."""
    tree = ast.parse((Path(__file__).parent / "settings.py").read_text())
    return frozenset(
        node.args[0].value for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _READERS
        and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def prefixes() -> list[str]:
    return [p for p in getattr(settings, "GPUSWEEP_SECRET_ENV_PREFIXES", ["GPUSWEEP_SECRET_"]) if p]


def own(name: str) -> bool:
    """A name the service reads for its own settings."""
    return name in RESERVED or name in OWN_NAMES or name in _settings_names()


def allowed(name: str) -> bool:
    return bool(name) and not own(name) and name.startswith(tuple(prefixes()))


def rule() -> str:
    """The rule in words, for a 400 and the forms."""
    listed = " or ".join(prefixes()) or "(none: GPUSWEEP_SECRET_ENV_PREFIXES is empty)"
    return (f"the NAME of an environment variable starting with {listed} (set by GPUSWEEP_SECRET_ENV_PREFIXES), "
            "never one of the service's own settings")


def problem(name: str) -> str:
    """What is wrong with naming `name` ("" when it is allowed)."""
    if own(name):
        return f"{name} is one of the service's own settings; use {rule()}"
    if not allowed(name):
        return f"{name!r} is not allowed; use {rule()}"
    return ""
