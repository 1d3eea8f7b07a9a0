"""A small Kubernetes API server for tests: real HTTP on localhost, the official client talks
to it over the wire. It serves what the inventory reads (GET /api/v1/nodes and /api/v1/pods
with limit/continue paging and the status.phase field selector) and checks the bearer token.
No API server can run on these machines, so this stands in for one (tests say so)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


def gpu_node(name: str, *, product: str = "NVIDIA-H100-80GB-HBM3", count: int = 8, driver: str = "570.86.15",
             cuda: str = "12.8", pool: str = "h100", ready: bool = True, unschedulable: bool = False) -> dict[str, Any]:
    major, minor, *rest = driver.split(".")
    labels = {
        "kubernetes.io/hostname": name,
        "cloud.google.com/gke-nodepool": pool,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rest[0] if rest else "",
        "nvidia.com/cuda.runtime.major": cuda.split(".")[0],
        "nvidia.com/cuda.runtime.minor": cuda.split(".")[1],
    }
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": {
            "capacity": {"cpu": "96", "memory": "1056495360Ki", "nvidia.com/gpu": str(count)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "nodeInfo": {"kernelVersion": "5.15.0-1053-nvidia", "osImage": "Ubuntu 22.04.4 LTS",
                         "operatingSystem": "linux"},
        },
    }


def gpu_pod(namespace: str, name: str, node: str, gpus: int, *, phase: str = "Running",
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "annotations": annotations or {}},
        "spec": {"nodeName": node, "activeDeadlineSeconds": 86400, "containers": [
            {"name": "main", "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
             "resources": {"limits": {"nvidia.com/gpu": str(gpus)} if gpus else {}}},
        ]},
        "status": {"phase": phase, "startTime": "2026-11-30T07:00:00Z"},
    }


class KubeApi:
    def __init__(self, token: str = "test-token") -> None:
        self.token = token
        self.nodes: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self.fail_status: int | None = None
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.requests.append(self.path)
                if api.fail_status:
                    return self._send(api.fail_status, {"kind": "Status", "message": "injected failure"})
                if self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._send(401, {"kind": "Status", "message": "Unauthorized", "code": 401})
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                if url.path == "/api/v1/nodes":
                    items, kind = api.nodes, "NodeList"
                elif url.path == "/api/v1/pods":
                    items, kind = api.pods, "PodList"
                    selector = query.get("fieldSelector", "")
                    if selector.startswith("status.phase="):
                        phase = selector.split("=", 1)[1]
                        items = [p for p in items if p["status"]["phase"] == phase]
                else:
                    return self._send(404, {"kind": "Status", "message": "not found", "code": 404})
                start = int(query.get("continue", "0") or 0)
                limit = int(query.get("limit", "0") or 0) or len(items)
                page = items[start:start + limit]
                more = start + limit < len(items)
                self._send(200, {"apiVersion": "v1", "kind": kind, "items": page,
                                 "metadata": {"continue": str(start + limit) if more else ""}})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> KubeApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
