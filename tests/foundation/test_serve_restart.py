"""Issue 28 item 8: `manage.py serve` starts a worker that died again, and says so, instead of
stopping the web server and beat with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.slow


def _children(pid: int) -> dict[int, str]:
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            found[int(child)] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def _worker(pid: int) -> int | None:
    return next((c for c, line in _children(pid).items() if " worker " in line), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_killed_worker_is_restarted_and_the_restart_logged(tmp_path):
    env = {**os.environ, "GPUSWEEP_VAR_DIR": str(tmp_path), "CELERY_BROKER_URL": "filesystem://",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    log = (tmp_path / "serve.log").open("w+")
    serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(_free_port()), "--concurrency", "1"],
                             cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (first := _worker(serve.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert first is not None, "no worker started"
        time.sleep(3)
        os.kill(first, signal.SIGKILL)
        while time.monotonic() < deadline + 30:
            second = _worker(serve.pid)
            if second not in (None, first) and "restarting" in (tmp_path / "serve.log").read_text():
                break
            time.sleep(0.5)
        text = (tmp_path / "serve.log").read_text()
        assert serve.poll() is None, text[-3000:]  # serve, the web server and beat still run
        assert "worker exited with status -9; restarting it" in text, text[-3000:]
        assert _worker(serve.pid) not in (None, first)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)
        log.close()
