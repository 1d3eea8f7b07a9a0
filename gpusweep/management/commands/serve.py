"""Run the web UI, a Celery worker and Celery beat together in one terminal session.

For development and the demo. Production runs each as its own service (see
docker-compose.yml). If any of the three exits, the others are stopped too, so a broken
worker is never hidden behind a web UI that still answers.
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
        while not stopping:
            for name, child in children.items():
                code = child.poll()
                if code is not None:
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
