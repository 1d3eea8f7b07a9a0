"""Run the web UI, a Celery worker and Celery beat together in one terminal session.

For development and the demo. Production runs each as its own service (see
docker-compose.yml). A worker or beat that dies is started again, and the restart is logged
(issue 28: one bad broker message used to stop the whole service); one that keeps dying at
start-up (RESTART_LIMIT times within RESTART_WINDOW_S) stops everything instead, as does the
web server exiting, so a broken install is never hidden behind a web UI that still answers.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

RESTARTABLE = ("worker", "beat")
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0


class Command(BaseCommand):
    help = "Serve the web UI with a Celery worker and beat in the same terminal session."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--concurrency", type=int, default=2)
        parser.add_argument(
            "--demo", action="store_true",
            help="also load the NVIDIA bulletins of the local mirror and run a demo fleet of local agents",
        )

    def handle(self, *args: Any, port: int, host: str, concurrency: int, demo: bool, **options: Any) -> None:
        python = sys.executable
        manage = str(settings.BASE_DIR / "manage.py")
        if demo:
            self._load_demo_advisories()
        commands = {
            "web": [python, str(settings.BASE_DIR / "manage.py"), "runserver", f"{host}:{port}", "--noreload"],
            "worker": [
                python, "-m", "celery", "-A", "gpusweep", "worker",
                "--loglevel", "INFO", "--concurrency", str(concurrency), "--hostname", "local@%h",
            ],
            "beat": [python, "-m", "celery", "-A", "gpusweep", "beat", "--loglevel", "INFO"],
        }
        if demo:
            commands["demo fleet"] = [
                python, manage, "demo_fleet", "--service-url", f"http://{host}:{port}", "--base-port", "0",
            ]
        children = {name: subprocess.Popen(cmd) for name, cmd in commands.items()}
        self.stdout.write(f"gpusweep is starting on http://{host}:{port}/ (Ctrl-C stops web, worker and beat)")

        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exit_code = 0
        restarts: dict[str, list[float]] = {name: [] for name in RESTARTABLE}
        while not stopping:
            for name, child in list(children.items()):
                code = child.poll()
                if code is None:
                    continue
                if self._may_restart(name, restarts):
                    self.stderr.write(f"{name} exited with status {code}; restarting it "
                                      f"(restart {len(restarts[name])} in {RESTART_WINDOW_S:.0f} s)")
                    children[name] = subprocess.Popen(commands[name])
                    continue
                self.stderr.write(f"{name} exited with status {code}; stopping the others")
                exit_code = code or 1
                stopping = True
                break
            time.sleep(0.3)
        for child in children.values():
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + 10
        for child in children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        sys.exit(exit_code)

    @staticmethod
    def _may_restart(name: str, restarts: dict[str, list[float]]) -> bool:
        if name not in restarts:
            return False
        now = time.monotonic()
        restarts[name] = [t for t in restarts[name] if now - t < RESTART_WINDOW_S] + [now]
        return len(restarts[name]) <= RESTART_LIMIT

    def _load_demo_advisories(self) -> None:
        """Ingest the shared NVIDIA corpus (or the bundled sample without it); unchanged documents cost nothing."""
        mirror = Path(settings.GPUSWEEP_SHARED_DATA_DIR) / "nvidia-csaf"
        source = mirror if mirror.is_dir() else settings.BASE_DIR / "tests" / "advisories" / "fixtures" / "csaf"
        self.stdout.write(f"demo: loading NVIDIA bulletins from {source}")
        try:
            call_command("ingest_advisories", str(source), "--no-progress", stdout=self.stdout)
        except CommandError as exc:
            # A rejected document is reported and the rest is loaded; the demo still starts.
            self.stderr.write(f"demo: {exc}")
