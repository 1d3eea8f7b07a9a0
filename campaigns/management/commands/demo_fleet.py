"""Run a demo fleet of node agents on this machine, each with a workload that counts steps.

    GPUSWEEP_AGENT_FLEET_SECRET=... python manage.py demo_fleet [--nodes 8] [--service-url URL]

Starts one `gpusweep-agent` per node (simulated patch and reboot, static facts) in two driver
branches, most below the fixed versions of NVIDIA bulletin 5703 (R570 570.195.03, R580 580.95.05),
registers them in the inventory (cluster "demo", local executor) and starts a demo counter on
each through `gpusweep-run` with the signal checkpoint engine. The agents heartbeat to the
service when it runs. Then plan, approve and run a campaign in the UI or the API and watch
`var/demo/counter-*.log` continue after every move. Ctrl-C stops agents and workloads.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from gpusweep_agent.auth import derive_node_key

from executors.agent_client import AgentClient
from executors.base import ExecutorError
from inventory.choices import ChangeSource, WorkloadKind
from inventory.models import Cluster, NodeComponent, Workload
from inventory.services import ObservedNode, ObservedWorkload, Snapshot, apply_snapshot

CLUSTER = "demo"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
# (driver, pool, how many): most below 5703's fixed versions, one R570 batch node already fixed
# (gpu06), and a "spare" node per branch (gpu05, gpu10), exposed like the rest. Sweeping pool
# "batch" moves every counter to gpu06 (not exposed, outside the sweep, 8 GPUs: the receiver the
# planner prefers), so no workload has to cold-start; the spares, being exposed, receive nothing
# and stay exposed until a campaign sweeps pool "spare" (README, Quick start;
# tests/campaigns/test_demo_plan.py).
LAYOUT = [("570.172.08", "batch", 4), ("570.172.08", "spare", 1), ("570.195.03", "batch", 1),
          ("580.82.07", "batch", 3), ("580.82.07", "spare", 1)]
COUNTER = Path(__file__).resolve().parents[2] / "demo" / "counter.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_healthy(env: dict[str, str], name: str, timeout: float = 30) -> None:
    client = AgentClient(env["GPUSWEEP_AGENT_ENDPOINT"], CLUSTER, name, secret=settings.GPUSWEEP_AGENT_FLEET_SECRET,
                         request_timeout=2)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.get("/v1/health")
            return
        except ExecutorError:
            if time.monotonic() > deadline:
                raise CommandError(f"demo_fleet: agent {name} did not answer within {timeout:.0f} s") from None
            time.sleep(0.2)


class Command(BaseCommand):
    help = "Run a demo fleet of local node agents with step-counting workloads (Ctrl-C stops it)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--nodes", type=int, default=10, help="at least 8")
        parser.add_argument("--base-port", type=int, default=17200, help="0 picks free ports")
        parser.add_argument("--service-url", default="http://127.0.0.1:8000")
        parser.add_argument("--dir", default=str(Path(settings.VAR_DIR) / "demo"))
        parser.add_argument("--once", action="store_true", help="start, register and exit (agents keep running)")

    def handle(self, *args: Any, nodes: int, base_port: int, service_url: str, dir: str, once: bool,
               **options: Any) -> None:
        secret = settings.GPUSWEEP_AGENT_FLEET_SECRET
        if not secret:
            raise CommandError("demo_fleet: set GPUSWEEP_AGENT_FLEET_SECRET (any long random string) in the "
                               "environment of this command and of the service (make run), so both sign alike")
        if nodes < 8:
            raise CommandError("demo_fleet: --nodes must be at least 8 (two driver branches with room to move)")
        root = Path(dir).resolve()
        root.mkdir(parents=True, exist_ok=True)
        plan = self._layout(nodes)
        processes: list[subprocess.Popen[bytes]] = []
        self.processes = processes
        ports = [base_port + index if base_port else _free_port() for index in range(len(plan))]
        try:
            for index, (name, driver, pool) in enumerate(plan):
                port = ports[index]
                env = self._agent_env(root, name, driver, port, secret, service_url)
                self._register(name, driver, pool, port)
                with (root / f"agent-{name}.log").open("ab") as log:
                    processes.append(subprocess.Popen([sys.executable, "-m", "gpusweep_agent.main"], env=env,
                                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=once))
            for index, (name, driver, _pool) in enumerate(plan):
                env = self._agent_env(root, name, driver, ports[index], secret, service_url)
                _wait_healthy(env, name)
                processes.append(self._workload(root, name, env, once))
            self.stdout.write(f"demo fleet: {len(plan)} agents in cluster {CLUSTER!r} on ports "
                              f"{', '.join(map(str, ports))}; counters in {root}/counter-*.log")
            if once:
                return
            self.stdout.write("Ctrl-C stops the demo fleet")
            stopping = False

            def stop(signum: int, frame: object) -> None:
                nonlocal stopping
                stopping = True

            signal.signal(signal.SIGINT, stop)
            signal.signal(signal.SIGTERM, stop)
            while not stopping:
                time.sleep(0.5)
        finally:
            if not once:
                for proc in processes:
                    if proc.poll() is None:
                        proc.terminate()
                self._kill_workloads(root)

    @staticmethod
    def _layout(count: int) -> list[tuple[str, str, str]]:
        """(name, driver, pool) per node; beyond the first ten, more batch nodes in turn."""
        slots = [(driver, pool) for driver, pool, n in LAYOUT for _ in range(n)]
        while len(slots) < count:
            slots.append((("570.172.08", "580.82.07")[len(slots) % 2], "batch"))
        return [(f"gpu{i + 1:02d}", driver, pool) for i, (driver, pool) in enumerate(slots[:count])]

    @staticmethod
    def _agent_env(root: Path, name: str, driver: str, port: int, secret: str, service_url: str) -> dict[str, str]:
        facts = {"gpu_model": GPU_MODEL, "gpu_count": 8, "product_line": "tesla", "os_family": "linux",
                 "components": {"driver": driver, "cuda": "12.8" if driver.startswith("570") else "13.0"}}
        facts_file = root / f"facts-{name}.json"
        if not facts_file.exists():  # a later run keeps what a demo campaign patched
            facts_file.write_text(json.dumps(facts))
        return {
            **os.environ, "GPUSWEEP_AGENT_KEY": derive_node_key(secret, CLUSTER, name),
            "GPUSWEEP_AGENT_CLUSTER": CLUSTER, "GPUSWEEP_AGENT_NODE": name, "GPUSWEEP_AGENT_PORT": str(port),
            "GPUSWEEP_AGENT_ENDPOINT": f"http://127.0.0.1:{port}",
            "GPUSWEEP_AGENT_STATE_DIR": str(root / f"state-{name}"),
            "GPUSWEEP_AGENT_ARTIFACT_DIR": str(root / "artifacts"),
            "GPUSWEEP_AGENT_PROBES": "static", "GPUSWEEP_AGENT_STATIC_FACTS": str(facts_file),
            "GPUSWEEP_AGENT_SERVICE_URL": service_url, "GPUSWEEP_AGENT_HEARTBEAT_INTERVAL": "10",
            "GPUSWEEP_AGENT_REBOOT_COMMAND": "simulate",
            "GPUSWEEP_AGENT_PATCH_METHODS": json.dumps({"package": {"simulate": True}}),
            # The demo's workloads are its counters; Slurm steps or pods this machine runs are not its nodes'.
            "GPUSWEEP_AGENT_SCHEDULER_WORKLOADS": "false",
        }

    @staticmethod
    def _register(name: str, driver: str, pool: str, port: int) -> None:
        """The node in the inventory through the inventory's own service (change log, exposures)."""
        cluster, _ = Cluster.objects.get_or_create(name=CLUSTER, defaults={
            "kind": "static", "description": "demo fleet of local agents", "connection": {"executor": "local"}})
        have = set(NodeComponent.objects.filter(node__cluster=cluster, node__name=name).values_list(
            "component", flat=True))
        versions = {"driver": driver, "cuda": "12.8" if driver.startswith("570") else "13.0"}
        # A later run keeps what a demo campaign patched (and its agent reports since).
        observed = ObservedNode(name, components={c: v for c, v in versions.items() if c not in have}, pool=pool,
                                gpu_model=GPU_MODEL, gpu_count=8, agent_endpoint=f"http://127.0.0.1:{port}")
        workload_id = f"count-{name}"
        known = Workload.objects.filter(cluster=cluster, kind=WorkloadKind.PROCESS, scheduler_id=workload_id).exists()
        workloads = [] if known else [ObservedWorkload(WorkloadKind.PROCESS, workload_id, node=name,
                                                       name=f"counter on {name}", gpus=1, checkpoint_engine="signal")]
        apply_snapshot(cluster, Snapshot(nodes=[observed], workloads=workloads, complete=False,
                                         workload_kinds=frozenset()), ChangeSource.FILE)

    @staticmethod
    def _workload(root: Path, name: str, env: dict[str, str], detached: bool) -> subprocess.Popen[bytes]:
        wrapper = shutil.which("gpusweep-run", path=str(Path(sys.executable).parent)) or "gpusweep-run"
        with (root / f"counter-{name}.out").open("ab") as out:
            return subprocess.Popen(
                [wrapper, "--workload-id", f"count-{name}", "--name", f"counter on {name}", "--engine", "signal",
                 "--gpus", "1", "--", sys.executable, str(COUNTER), str(root / f"counter-{name}.log")],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    @staticmethod
    def _kill_workloads(root: Path) -> None:
        for registry in root.glob("state-*/workloads.json"):
            try:
                entries = json.loads(registry.read_text())
            except (OSError, ValueError):
                continue
            for entry in entries.values() if isinstance(entries, dict) else entries:
                pid = int(entry.get("pid") or 0) if isinstance(entry, dict) else 0
                if pid > 1:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except (ProcessLookupError, PermissionError):
                        pass
