"""Fixtures for the advisories tests: the bundled CSAF copies, the shared corpus, a fleet, and a
real HTTP server (http.server in a thread) that serves files, an HTML page, a huge body and a hang."""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from conftest import need
from inventory.models import Cluster, Node, NodeComponent
from inventory.versions import parse_version

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "csaf"
INDEX = FIXTURES.parent / "nvidia-index.json"
SHARED_CSAF = Path(settings.GPUSWEEP_SHARED_DATA_DIR) / "nvidia-csaf"


@pytest.fixture
def shared_csaf() -> Path:
    need(SHARED_CSAF.is_dir(), f"needs NVIDIA's CSAF corpus at {SHARED_CSAF} (the shared data folder beside the "
         "checkout, or set GPUSWEEP_SHARED_DATA_DIR)")
    return SHARED_CSAF


def bulletins(root: Path) -> list[Path]:
    """Every CSAF document below `root`, found by content whatever its folder or name, by the rule
    the ingest reads a folder with (`advisories.sources.json_kind`): a broken bulletin is kept, to
    fail, and a CVE record, an OSV record or an index is left out."""
    from advisories.sources import CSAF, json_kind

    return [path for path in sorted(root.rglob("*.json")) if json_kind(path.read_bytes()) == CSAF]


def add_node(cluster: Cluster, name: str, **versions: str) -> Node:
    node = Node.objects.create(cluster=cluster, name=name)
    for component, version in versions.items():
        parsed = parse_version(component, version)
        NodeComponent.objects.create(node=node, component=component, version=version, version_key=parsed.key,
                                     branch=parsed.branch)
    return node


def set_version(node: Node, component: str, version: str) -> None:
    parsed = parse_version(component, version)
    NodeComponent.objects.update_or_create(
        node=node, component=component,
        defaults={"version": version, "version_key": parsed.key, "branch": parsed.branch},
    )


class Routes(http.server.BaseHTTPRequestHandler):
    """Serves `routes` {path: (status, content_type, body | callable)}; supports ETag."""

    routes: dict[str, tuple[int, str, bytes | Callable[[http.server.BaseHTTPRequestHandler], None]]] = {}
    hits: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        self.hits.append((self.path, self.headers.get("If-None-Match", "")))
        route = self.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        status, content_type, body = route
        if callable(body):
            body(self)
            return
        etag = f'"{hash(body) & 0xFFFFFFFF:x}"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", etag)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def huge_body(handler: http.server.BaseHTTPRequestHandler) -> None:
    """100 MB without a Content-Length: the client must stop at its limit by counting."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.end_headers()
    chunk = b" " * (1024 * 1024)
    try:
        for _ in range(100):
            handler.wfile.write(chunk)
    except OSError:
        pass  # the client hung up at its limit


def hang(handler: http.server.BaseHTTPRequestHandler) -> None:
    time.sleep(5)


@pytest.fixture
def http_server() -> Iterator[tuple[str, type[Routes]]]:
    class Handler(Routes):
        routes = {}
        hits = []

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", Handler
    finally:
        server.shutdown()
        server.server_close()


PUBLISHED_5703 = dt.datetime(2025, 10, 9, tzinfo=dt.UTC)


@contextlib.contextmanager
def eager_tasks() -> Iterator[None]:
    """Celery tasks queued inside run at once, in this process (no worker)."""
    from gpusweep.celery import app

    app.conf.task_always_eager = True
    try:
        yield
    finally:
        app.conf.task_always_eager = False
