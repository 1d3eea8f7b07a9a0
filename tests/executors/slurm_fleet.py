"""A Slurm cluster with a gpusweep agent per node, for the Slurm executor's tests.

Real parts: munged, slurmctld, one `slurmd -N` per node (tests/slurm_cluster.py), a real
`gpusweep-agent` process per node (static facts: there are no GPUs here), and batch jobs whose
payload is the agent tests' step counter under `gpusweep-run`. A job finds its node's agent
through `$SLURMD_NODENAME`: each node has a configuration file naming its agent and key file,
as a site's /etc/gpusweep-agent.json would.

The agents' simulated reboot (`reboot_command=simulate`) restarts the agent with the patched
versions and, through `simulated_reboot_hook`, that node's slurmd: on one host nothing more of
a reboot can happen (see docs/architecture/campaigns.md, Slurm).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from executors.base import NodeRef
from inventory.sources.slurm import CliSlurmClient
from tests.helpers import HOLDER, REPO, wait_for
from tests.slurm_cluster import SlurmCluster

sys.path.insert(0, str(REPO / "agent" / "tests"))
import agent_helpers as agents

OLD_DRIVER = "570.86.15"
GPU_MODEL = "H100"
# The site publishes its versions and GPU model as node features (inventory.sources.slurm).
FEATURES = f"nvdriver_{OLD_DRIVER},cuda_12.8,gpumodel_{GPU_MODEL}"
FACTS = {**agents.FACTS, "gpu_model": GPU_MODEL}
RUN = ("running", "restored")
# The agents' patches are simulated: the version takes effect at the modelled reboot.
PATCH_METHODS = json.dumps({"package": {"simulate": True, "commands": {
    "kernel": "apt-get install -y --no-install-recommends linux-image-{version}"}}})


class SlurmFleet:
    def __init__(self, root: Path, nodes: list[str], shared_artifacts: bool = True,
                 features: dict[str, str] | None = None, accounting: bool = False,
                 cluster_class: type[SlurmCluster] = SlurmCluster, **shape: Any) -> None:
        """`features` None: every node publishes FEATURES ({}: none); `shape`: SlurmCluster's site options
        (gres_type, job_file_append)."""
        self.root = root
        self.names = list(nodes)
        root.mkdir(parents=True, exist_ok=True)
        self.cluster = cluster_class(root / "slurm", nodes=nodes, accounting=accounting,
                                    features=dict.fromkeys(nodes, FEATURES) if features is None else features,
                                    **shape)
        self.shared = root / "shared-artifacts" if shared_artifacts else None
        self.libcuda: Path | None = None  # the agents' libcuda (None: their default, absent here)
        self.agents: dict[str, agents.AgentProcess] = {}
        # What each node's agent reports (its static facts): FACTS, with a node's own driver where a test set one
        # (set_driver), and the GPU count Slurm declares (a real agent counts the same GPUs Slurm schedules).
        self.drivers: dict[str, str] = {}
        # A real site health check in every agent, failed on a node by fail_check(node, output).
        self.health_options, self.fail_check = agents.site_check(root)

    # -- life -------------------------------------------------------------------------
    def start(self) -> SlurmFleet:
        self.cluster.start()
        try:
            # The cluster counts "idle*" (registered, not yet answering) as up; jobs need it answering.
            assert wait_for(lambda: all(self.takes_work(n) for n in self.names), 60, interval=0.5), \
                self.cluster.logs()
            for name in self.names:
                self.start_agent(name)
        except BaseException:
            self.stop()
            raise
        return self

    def start_agent(self, name: str) -> agents.AgentProcess:
        """The node's agent, started afresh: no state, the old versions."""
        store = self.shared or self.root / f"artifacts-{name}"
        shutil.rmtree(self.root / f"state-{name}", ignore_errors=True)
        hook = shlex.join(["sh", str(self.cluster.restart_slurmd_script(name))])
        self.gpu_device(name).parent.mkdir(exist_ok=True)
        self.gpu_device(name).touch()
        agent = agents.AgentProcess(self.root, name, store, self.facts_of(name), reboot_command="simulate",
                                    patch_methods=PATCH_METHODS, simulated_reboot_hook=hook,
                                    health_options=self.health_options,
                                    gpu_devices=str(self.gpu_device(name).parent / "nvidia[0-9]*"),
                                    **({"libcuda": str(self.libcuda)} if self.libcuda else {}))
        agent.start()
        self.agents[name] = agent
        key_file = self.root / f"key-{name}"
        key_file.write_text(agent.key)
        key_file.chmod(0o600)
        (self.root / f"agent-{name}.json").write_text(json.dumps({
            "cluster": agents.CLUSTER, "node": name, "endpoint": f"http://127.0.0.1:{agent.port}",
            "key_file": str(key_file)}))
        return agent

    def facts_of(self, name: str) -> dict[str, Any]:
        """The static facts node `name`'s agent starts with."""
        components = {**FACTS["components"], **({"driver": self.drivers[name]} if name in self.drivers else {})}
        return {**FACTS, "gpu_count": self.cluster.gpus_per_node, "components": components}

    def set_driver(self, name: str, version: str | None) -> None:
        """Node `name` runs driver `version` from now on (None: the old one, as every node starts): its agent
        starts again reporting it, as after a patch done outside gpusweep."""
        if version is None or version == OLD_DRIVER:
            self.drivers.pop(name, None)
        else:
            self.drivers[name] = version
        if name in self.agents and not self._fresh(name):
            self.agents[name].stop()
            self.start_agent(name)

    def gpu_device(self, name: str) -> Path:
        """The node's stand-in GPU device: a file its agent treats as one (``gpu_devices``; no GPU here)."""
        return self.root / f"dev-{name}" / "nvidia0"

    def share_artifacts(self, shared: bool) -> None:
        """Restart every agent with one shared artifact folder, or each with its own (images then travel
        between agents)."""
        if shared == (self.shared is not None):
            return
        self.shared = self.root / "shared-artifacts" if shared else None
        for name in self.names:
            self.agents[name].stop()
            self.start_agent(name)

    def use_libcuda(self, library: Path | None) -> None:
        """Restart every agent with `library` as its libcuda (a stand-in, for the cuda engine), or the default."""
        if library == self.libcuda:
            return
        self.libcuda = library
        for name in self.names:
            self.agents[name].stop()
            self.start_agent(name)

    def _fresh(self, name: str) -> bool:
        """The node's agent runs with the old versions and no workload, maintenance or patch of before."""
        agent = self.agents[name]
        if agent.proc is None or agent.proc.poll() is not None:
            return False
        try:
            facts = agent.client.get("/v1/facts")
            workloads = agent.client.get("/v1/workloads")["workloads"]
            health = agent.client.get("/v1/health")
        except Exception:  # noqa: BLE001 - not answering: start it again
            return False
        return (facts.get("components") == self.facts_of(name)["components"] and not workloads
                and not health["maintenance"] and not (agent.state / "pending_facts.json").exists())

    def stop(self) -> None:
        try:
            self.cluster.stop()
        finally:
            for agent in self.agents.values():
                agent.stop()

    def __enter__(self) -> SlurmFleet:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def make_cluster(self, heartbeat_first: bool = False, **connection: Any) -> Any:
        """The cluster in gpusweep's inventory (named as the agents' identity), synced from Slurm, with each
        node's agent endpoint as its heartbeat would set it; then each agent's heartbeat (`heartbeat_first`: the
        heartbeats before the Slurm sync, and none after it)."""
        from inventory.models import Cluster, Node
        from inventory.sync import sync_cluster

        cluster = Cluster.objects.create(name=agents.CLUSTER, kind="slurm", connection={
            **self.connection, "executor_options": {"operation_timeout": 60, "restore_wait_s": 60}, **connection})
        if heartbeat_first:
            for name in self.agents:
                self.heartbeat(cluster, name)
        sync_cluster(cluster)
        for name, agent in self.agents.items():
            Node.objects.filter(cluster=cluster, name=name).update(agent_endpoint=f"http://127.0.0.1:{agent.port}")
            if not heartbeat_first:
                self.heartbeat(cluster, name)
        return cluster

    def heartbeat(self, cluster: Any, name: str) -> None:
        """The workloads node `name`'s agent heartbeat reports (each gpusweep-run registration on its job's row:
        inventory.identity), applied as the heartbeat endpoint applies them. Its node facts only where Slurm
        publishes none for the node (no features: the agent is the one source of its GPU model and versions, as
        at such a site); elsewhere they are left out: the test agents report only the few facts their files
        hold, where a real agent's probes read the rest."""
        from gpusweep_agent.heartbeat import SCHEMA
        from gpusweep_agent.workloads import LIVE_STATES, WorkloadRegistry, listed

        from inventory.agent import parse_heartbeat
        from inventory.choices import ChangeSource, WorkloadKind
        from inventory.services import ObservedNode, Snapshot, apply_snapshot

        # The agent's registrations as its /v1/workloads lists them, read from its registry: asking the agent
        # would also scan /proc for GPU users, seconds on a busy machine, which the tests' short jobs cannot spare.
        registered = WorkloadRegistry(self.agents[name].state).all().values()
        reported = [{k: v for k, v in listed(w).items() if k not in ("id", "pid", "state")}
                    for w in registered if w.get("state") in LIVE_STATES]
        facts = {} if self.cluster.features.get(name) else self.agents[name].client.get("/v1/facts")
        payload = {"schema": SCHEMA, "cluster": cluster.name, "node": name, "facts": facts, "workloads": reported,
                   "endpoint": f"http://127.0.0.1:{self.agents[name].port}"}
        node, workloads = parse_heartbeat(payload, cluster.name, name)
        apply_snapshot(cluster, Snapshot(nodes=[node if facts else ObservedNode(name)], workloads=workloads,
                                         complete=False, replace_components=bool(facts),
                                         workload_kinds=frozenset({WorkloadKind.PROCESS})), ChangeSource.AGENT)

    # -- views ------------------------------------------------------------------------
    @property
    def connection(self) -> dict[str, Any]:
        shared = {"shared_checkpoint_dir": str(self.shared)} if self.shared else {}
        return {"slurm_conf": str(self.cluster.conf), "executor": "slurm", **shared}

    def ref(self, name: str) -> NodeRef:
        endpoint = f"http://127.0.0.1:{self.agents[name].port}" if name in self.agents else ""
        return NodeRef(agents.CLUSTER, name, endpoint=endpoint, gpu_count=self.cluster.gpus_per_node)

    def client(self) -> CliSlurmClient:
        return CliSlurmClient(self.connection)

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.client().nodes() if n["name"] == name)

    def takes_work(self, name: str) -> bool:
        info = self.node(name)
        raw = info.get("state", "")
        words = {str(w).lower() for w in [*(raw if isinstance(raw, list) else [raw]), *info.get("state_flags", [])]}
        return not words & {"drain", "drained", "draining", "down", "not_responding", "maintenance", "fail"}

    def jobs(self) -> list[dict[str, Any]]:
        return self.client().jobs()

    def job(self, job_id: str) -> dict[str, Any] | None:
        return next((j for j in self.jobs() if str(j["job_id"]) == job_id), None)

    def running(self, name: str) -> set[str]:
        """Jobs Slurm runs on `name` whose payload the node's agent runs."""
        listed = {w["id"] for w in self.agents[name].client.get("/v1/workloads")["workloads"]
                  if w.get("state") in RUN}
        return {f"slurm-{j['job_id']}" for j in self.jobs() if _state(j) == "RUNNING"
                and j.get("batch_host") == name and f"slurm-{j['job_id']}" in listed}

    # -- jobs -------------------------------------------------------------------------
    def counter_job(self, log: Path, node: str, engine: str = "signal", name: str = "counter",
                    interval: float = 0.05, extra: str = "", gpus: int = 1, holds: Path | None = None,
                    prints: bool = False, open_mode: str = "") -> str:
        """A batch job on `node` ("": wherever Slurm starts it) asking for `gpus` GPUs whose payload counts steps
        into `log` under gpusweep-run; with `holds` the counter keeps that stand-in GPU device open
        (tests/gpu_holder.py); with `prints` the job prints a first line and the counter each step to the job's
        output file (cluster.output_of)."""
        run = Path(sys.executable).parent / "gpusweep-run"
        holder = f"{sys.executable} {HOLDER} {holds} " if holds is not None else ""
        command = (f"GPUSWEEP_AGENT_CONFIG={self.root}/agent-$SLURMD_NODENAME.json exec {run} --engine {engine} "
                   f"{extra} -- {holder}{sys.executable} {agents.COUNTER} {log} 1 {interval}")
        if prints:
            command = f"echo job begins on $SLURMD_NODENAME; COUNTER_STDOUT=1 {command}"
        return self.cluster.sbatch(command, nodelist=node or None, gpus=gpus, name=name, open_mode=open_mode)

    def reset(self) -> None:
        """Between tests: no job left, every node resumed and idle, its agent fresh, its old versions back."""
        self.cluster.run("scancel", "--full", "-u", "root", check=False)
        for flag in self.root.glob("health-flag-*"):
            flag.unlink()
        ended = ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                 "OUT_OF_MEMORY")
        assert wait_for(lambda: all(_state(j) in ended for j in self.jobs()), 60, interval=0.5), self.jobs()
        for name in self.names:
            if not self.takes_work(name):
                self.cluster.run("scontrol", "update", f"nodename={name}", "state=RESUME", check=False)
            features = self.cluster.features.get(name, "")
            if (self.node(name).get("active_features") or "") != features:
                self.cluster.run("scontrol", "update", f"nodename={name}", f"availablefeatures={features}",
                                 f"activefeatures={features}")
            if not self._fresh(name):
                self.agents[name].stop()
                self.start_agent(name)
        for reservation in self.cluster.run("scontrol", "show", "reservation", "-o", check=False).splitlines():
            if reservation.startswith("ReservationName="):
                name = reservation.split()[0].split("=", 1)[1]
                self.cluster.run("scontrol", "delete", f"reservationname={name}", check=False)
        assert wait_for(lambda: all(self.takes_work(n) for n in self.names), 60, interval=0.5), \
            [(n["name"], n["state"], n["state_flags"], n["reason"]) for n in self.client().nodes()]


def _state(job: dict[str, Any]) -> str:
    state = job.get("job_state", "")
    return str(state[0] if isinstance(state, list) and state else state).upper()
