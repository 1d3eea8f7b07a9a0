"""Boot the real service (web, Celery worker, beat) the way `make run` does and ask /readyz."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import need
from tests.helpers import (
    REPO,
    clean_env,
    free_port,
    get_json,
    manage,
    stop_process_group,
    throwaway_database_url,
    wait_for,
)

pytestmark = pytest.mark.slow


STAFF_TOKEN = ("from django.contrib.auth.models import User; from rest_framework.authtoken.models import Token; "
               "print(Token.objects.create(user=User.objects.create_superuser({name!r}, password=None)).key)")


def _staff_token(env: dict[str, str]) -> str:
    """/readyz shows its details to staff only; an API token of a superuser is how a probe gets them.

    The user's name is unique per run: against PostgreSQL the test boots the configured database
    itself (not pytest's throwaway copy), which keeps the users of earlier runs."""
    made = manage("shell", "-c", STAFF_TOKEN.format(name=f"probe-{uuid.uuid4().hex[:12]}"), env=env)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


def _details(port: int, token: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/readyz", headers={"Authorization": f"Token {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _boot_and_probe(env: dict[str, str], log: Path) -> tuple[float, dict]:
    """Boot, wait for /readyz to say ready (to anyone), and return its details (as staff)."""
    migrated = manage("migrate", "--noinput", env=env)
    assert migrated.returncode == 0, migrated.stderr
    token = _staff_token(env)
    port = free_port()
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), "serve", "--port", str(port), "--concurrency", "1"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        def ready() -> dict | None:
            try:
                status, body = get_json(f"http://127.0.0.1:{port}/readyz", timeout=5)
            except OSError:
                return None
            return body if status == 200 else None

        body = wait_for(ready, timeout=60, interval=1)
        elapsed = time.monotonic() - started
        assert body, f"/readyz never answered 200 within 60 s; log:\n{log.read_text()[-4000:]}"
        assert body == {"status": "ready"}, "anonymous callers learn nothing about the parts"
        return elapsed, _details(port, token)
    finally:
        stop_process_group(proc)


def test_the_embedded_default_is_ready_within_60_seconds(tmp_path: Path):
    env = clean_env(GPUSWEEP_VAR_DIR=str(tmp_path / "var"))
    elapsed, body = _boot_and_probe(env, tmp_path / "serve.log")
    assert body["checks"]["database"]["vendor"] == "sqlite"
    assert "filesystem" in body["checks"]["broker"]["transport"]
    assert body["checks"]["workers"]["workers"], "a real worker must answer the ping"
    assert elapsed < 60
    # WAL is a property of the database file, so it outlives the processes.
    with sqlite3.connect(tmp_path / "var" / "gpusweep.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.postgres
@pytest.mark.redis
def test_postgres_and_redis_are_configuration_only(tmp_path: Path):
    db = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    need(
        db.startswith("postgres") and broker.startswith("redis"),
        "set DATABASE_URL=postgres://root@127.0.0.1:5432/test and CELERY_BROKER_URL=redis://127.0.0.1:6379/0 "
        "(as .ci/run does) to boot against PostgreSQL and Redis",
    )
    with throwaway_database_url(db, tmp_path, "boot") as own_db:
        env = clean_env(GPUSWEEP_VAR_DIR=str(tmp_path / "var"), DATABASE_URL=own_db, CELERY_BROKER_URL=broker)
        _elapsed, body = _boot_and_probe(env, tmp_path / "serve.log")
    assert body["checks"]["database"]["vendor"] == "postgresql"
    assert "redis" in body["checks"]["broker"]["transport"].lower()
    assert body["checks"]["workers"]["workers"]


def test_readyz_says_not_ready_without_a_worker(tmp_path: Path):
    env = clean_env(GPUSWEEP_VAR_DIR=str(tmp_path / "var"), GPUSWEEP_READYZ_PING_TIMEOUT_MS="300")
    assert manage("migrate", "--noinput", env=env).returncode == 0
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), "runserver", f"127.0.0.1:{port}", "--noreload"],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        def answered() -> tuple[int, dict] | None:
            try:
                return get_json(f"http://127.0.0.1:{port}/readyz")
            except OSError:
                return None

        result = wait_for(answered, timeout=30)
        assert result is not None
        status, body = result
        assert status == 503
        assert body == {"status": "not ready", "failed": "workers"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
