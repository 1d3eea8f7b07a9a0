"""Soak of the embedded default: `serve --demo` (what `make run` starts: SQLite, the filesystem broker,
one worker and beat under serve) and N campaigns back to back over the demo's nodes through the REST
API, each planned, approved by a second person, started and waited for.

It prints, per campaign, how it ended and how long it took, and at the end whether every campaign
completed, how many times `serve` restarted its worker or beat (each restart is logged), and
whether the broker's folder holds a message nobody took (a lost one). Exit 1 when any of these
fails. Usage:

    .venv/bin/python bench/soak.py --campaigns 200            # the issue's soak (about 30 minutes)
    .venv/bin/python bench/soak.py --campaigns 3 --pool spare  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from campaigns.demo import printed_logins  # noqa: E402 (after the path it needs)

TERMINAL = {"completed", "halted", "aborted"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _call(base: str, method: str, path: str, token: str = "", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, text.decode(errors="replace")[:500]


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), *args], env=env, cwd=REPO, text=True,
                          capture_output=True, check=True)
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--campaigns", type=int, default=200)
    parser.add_argument("--pool", default="spare", help="the demo pool each campaign sweeps (spare: 2 nodes)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one campaign may take")
    parser.add_argument("--keep", help="a folder for the run's files (default: a temporary one)")
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="gpusweep-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    ours = {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "GPUSWEEP_CACHE_URL"}
    env = {k: v for k, v in os.environ.items() if k not in ours} | {"GPUSWEEP_VAR_DIR": str(root / "var")}
    _manage(env, "migrate", "--noinput")
    logins = printed_logins(_manage(env, "ensure_demo_admin"))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = root / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen([sys.executable, str(REPO / "manage.py"), "serve", "--port", str(port), "--demo",
                                  "--concurrency", "2"], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    results: list[tuple[int, str, float]] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _call(base, "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                print(log.read_text()[-3000:])
                return 1
            time.sleep(1)
        tokens = {}
        for user in ("admin", "approver"):
            status, body = _call(base, "POST", "/api/v1/accounts/token/", body={
                "username": user, "password": logins[user], "name": "soak"})
            assert status in (200, 201), (status, body)
            tokens[user] = body["key"]
        started = time.monotonic()
        for k in range(1, args.campaigns + 1):
            began = time.monotonic()
            # A higher patch release each time, so that every campaign has nodes to sweep.
            targets = {"driver": {"R570": f"570.195.{10 + k}", "R580": f"580.95.{10 + k}"}}
            status, body = _call(base, "POST", "/api/v1/campaigns/campaigns/", tokens["admin"], {
                "name": f"soak {k}", "clusters": ["demo"], "pools": [args.pool], "target_versions": targets,
                "canary": "0", "soak_s": 0, "parallelism_per_cluster": "2"})
            assert status == 201, (status, body)
            campaign = body["id"]
            for who, action in (("admin", "plan"), ("approver", "approve"), ("admin", "start")):
                status, body = _call(base, "POST", f"/api/v1/campaigns/campaigns/{campaign}/{action}/", tokens[who],
                                     {})
                assert status in (200, 201), (action, status, body)
            state = ""
            while time.monotonic() - began < args.timeout:
                state = _call(base, "GET", f"/api/v1/campaigns/campaigns/{campaign}/", tokens["admin"])[1]["status"]
                if state in TERMINAL:
                    break
                time.sleep(0.5)
            took = time.monotonic() - began
            results.append((campaign, state, took))
            print(f"campaign {k:>4} (id {campaign}): {state or 'no answer'} in {took:.1f} s", flush=True)
            if state != "completed":
                break
        total = time.monotonic() - started
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    restarts = len(re.findall(r"restart", text, flags=re.IGNORECASE))
    broker = root / "var" / "broker"
    waiting = [p for p in broker.rglob("*") if p.is_file() and "out" in p.parts] if broker.exists() else []
    completed = sum(1 for _, state, _ in results if state == "completed")
    times = sorted(t for _, _, t in results)
    print(f"\n{completed} of {args.campaigns} campaigns completed in {total:.0f} s "
          f"(per campaign: median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s)")
    print(f"worker or beat restarts logged by serve: {restarts}")
    print(f"messages left in the broker's folder: {len(waiting)}")
    print(f"files: {root}")
    return 0 if completed == args.campaigns and restarts == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
