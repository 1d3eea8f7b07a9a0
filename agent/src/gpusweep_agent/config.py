"""Agent configuration: a JSON file, then environment variables, then command-line flags.

Every setting has a name; the file holds it under that name, the environment as
``GPUSWEEP_AGENT_<NAME>`` (upper case) and the command line as ``--<name>`` (dashes). The node
key never lives in the file: it comes from ``GPUSWEEP_AGENT_KEY`` or a file named by ``key_file``.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

ENV_PREFIX = "GPUSWEEP_AGENT_"
DEFAULT_PROBES = ["kernel", "livepatch", "checkpoint_tools", "packages", "pip", "images", "nvidia_smi", "nvml"]
DEFAULT_HEALTH_CHECKS = ["versions", "gpus", "dcgm", "site"]
# Device files whose open descriptors mark a process as a GPU user (workloads.gpu_users).
DEFAULT_GPU_DEVICES = ["/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm"]
DEFAULT_GPU_SYSTEM_PROCESSES = ["nvidia-persiste", "nv-hostengine", "nv-fabricmanage", "nvidia-smi", "dcgmi"]


class ConfigError(Exception):
    """The configuration is missing a value or holds a bad one."""


@dataclass
class AgentConfig:
    cluster: str = "local"
    node: str = ""
    key: str = field(default="", repr=False)
    key_file: str = ""
    listen: str = "127.0.0.1"
    port: int = 17100
    # A Unix socket serving the same signed API besides the TCP port (""; none): a workload pod reaches its
    # node's agent through it from a hostPath, with no network path (deploy/kubernetes/agent.yaml).
    socket: str = ""
    endpoint: str = ""
    state_dir: Path = Path("/var/lib/gpusweep-agent")
    artifact_dir: Path = Path()  # default: <state_dir>/artifacts
    probes: list[str] = field(default_factory=lambda: list(DEFAULT_PROBES))
    static_facts: str = ""
    service_url: str = ""
    heartbeat_interval: float = 30.0
    heartbeat_max_backoff: float = 300.0
    # Report the OS in heartbeats (osinfo.py: os-release, installed packages, running kernel, livepatch).
    report_os: bool = True
    criu: str = "criu"
    # Where the node's kubelet writes its ContainerCheckpoint archives (served read-only at
    # /v1/kubelet-checkpoints/<name> for gpusweep to build the checkpoint image); in a container, under the
    # host root it mounts.
    kubelet_checkpoint_dir: Path = Path("/var/lib/kubelet/checkpoints")
    # Flush a checkpoint's images to disk before it counts as taken (the node is patched and rebooted next).
    checkpoint_fsync: bool = True
    # At most this many `criu pre-dump` rounds while the workload runs, before its (short) final dump;
    # 0: a plain dump. Needs the kernel's dirty-memory tracking; without it the dump is plain (and says so).
    criu_pre_dumps: int = 3
    # Move criu workloads lazily (engines/lazy.py): the receiver resumes the workload before its memory
    # arrives, pages streamed from this node's CRIU page server on lazy_pages_address ("": `listen`) until
    # all have gone. A checkpoint request's `lazy_pages` overrides it. Off: the whole image first.
    criu_lazy_pages: bool = False
    lazy_pages_address: str = ""
    # Two-phase release of a lazy move: once the page server ends, the source keeps its copy stopped until
    # the receiver reports; with no word from the receiver for this long it resumes its copy (the receiver
    # kills its own after half of it without an answer from the source, so the two never both run).
    lazy_release_timeout_s: float = 30.0
    signal_timeout: float = 60.0
    # name -> dotted path of a CheckpointEngine / PatchMethod / Probe class; merged over the built-ins.
    engines: dict[str, str] = field(default_factory=dict)
    patch_methods: dict[str, dict[str, Any]] = field(default_factory=dict)
    # "" refuses to reboot, "simulate" restarts the agent with the pending facts, anything else is run.
    reboot_command: str = ""
    # An agent in a container that patches its node (the Kubernetes DaemonSet, with hostPID): the command
    # prefix that runs a command in the node's namespaces ("nsenter -t 1 -m -u -i -n -p --") and the node's
    # root as a path here ("/proc/1/root"). Patch commands, the reboot, the package manager's queries and
    # installs and the OS report's tools go through the prefix; /etc/os-release is read under the root. A CRIU
    # dump and a restore into a container take the node's view of cgroups (and the container's root), from the
    # namespaces of the process whose root host_root is (util.host_pid). "" and "/": the agent runs on the node.
    host_exec: str = ""
    host_root: Path = Path("/")
    # With reboot_command "simulate": a command started (detached) at the simulated reboot, for what a real
    # reboot restarts besides the agent, e.g. the node's slurmd (tests/slurm_cluster.py restart_slurmd_script).
    simulated_reboot_hook: str = ""
    libcuda: str = "libcuda.so.1"
    # Optional TLS; with tls_client_ca set, callers must also present a certificate it signed (mutual TLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # Health gates (health/): the checks to run, in order, and each one's options by name.
    health_checks: list[str] = field(default_factory=lambda: list(DEFAULT_HEALTH_CHECKS))
    health_options: dict[str, Any] = field(default_factory=dict)
    # Rollback (packages.py): "auto" (dpkg or rpm, whichever is here), "dpkg", "rpm", or "recording"
    # (the test stand-in, its database in package_db); component -> package name patterns.
    package_manager: str = "auto"
    package_db: str = ""
    packages: dict[str, Any] = field(default_factory=dict)
    # List the Slurm job steps and Kubernetes pods found by cgroup among the node's workloads (those of
    # its own node only, on a host running several slurmd: workloads.discover_cgroup_workloads). Off for
    # agents that run no scheduler's work on a shared host, e.g. manage.py demo_fleet's.
    scheduler_workloads: bool = True
    # GPU users beyond the scheduler: glob patterns of the device files that mean "holds a GPU".
    gpu_devices: list[str] = field(default_factory=lambda: list(DEFAULT_GPU_DEVICES))
    # Node daemons that hold GPUs by design: listed as GPU users, never moved or stopped as workloads.
    gpu_system_processes: list[str] = field(default_factory=lambda: list(DEFAULT_GPU_SYSTEM_PROCESSES))

    @property
    def identity(self) -> str:
        return f"{self.cluster}/{self.node}"

    def public(self) -> dict[str, Any]:
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if f.name not in ("key",)}


def _coerce(name: str, value: Any, current: Any) -> Any:
    try:
        if isinstance(current, bool):
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
        if isinstance(current, int):
            return int(value)
        if isinstance(current, float):
            return float(value)
        if isinstance(current, Path):
            return Path(value)
        if isinstance(current, list):
            return value if isinstance(value, list) else [v.strip() for v in str(value).split(",") if v.strip()]
        if isinstance(current, dict):
            parsed = value if isinstance(value, dict) else json.loads(value)
            if not isinstance(parsed, dict):
                raise ValueError("expected a JSON object")
            return parsed
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"setting {name!r}: bad value {value!r} ({exc})") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="JSON configuration file (or GPUSWEEP_AGENT_CONFIG)")
    for f in fields(AgentConfig):
        if f.name != "key":
            parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, default=None)


def load_config(args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> AgentConfig:
    env = dict(os.environ if environ is None else environ)
    config = AgentConfig()
    names = {f.name for f in fields(AgentConfig)}
    path = getattr(args, "config", None) or env.get(ENV_PREFIX + "CONFIG")
    layers: list[dict[str, Any]] = []
    if path:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"configuration file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"configuration file {path}: expected a JSON object")
        unknown = set(data) - names
        if unknown or "key" in data:
            bad = sorted(unknown | ({"key"} & set(data)))
            raise ConfigError(f"configuration file {path}: unknown or forbidden settings {bad}")
        layers.append(data)
    layers.append({n: env[ENV_PREFIX + n.upper()] for n in names if ENV_PREFIX + n.upper() in env})
    if args is not None:
        layers.append({n: v for n in names if (v := getattr(args, n, None)) is not None})
    for layer in layers:
        for name, value in layer.items():
            setattr(config, name, _coerce(name, value, getattr(config, name)))
    if not config.key and config.key_file:
        try:
            config.key = Path(config.key_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"key_file {config.key_file}: {exc}") from None
    if config.artifact_dir == Path():
        config.artifact_dir = config.state_dir / "artifacts"
    if not config.node:
        config.node = os.uname().nodename.split(".")[0]
    if not config.key:
        raise ConfigError("no node key: set GPUSWEEP_AGENT_KEY or key_file (manage.py agent_key CLUSTER NODE)")
    if bool(config.tls_cert) != bool(config.tls_key) or (config.tls_client_ca and not config.tls_cert):
        raise ConfigError("TLS needs both tls_cert and tls_key (and tls_client_ca only with them)")
    if not config.endpoint:
        scheme = "https" if config.tls_cert else "http"
        config.endpoint = f"{scheme}://{config.listen}:{config.port}"
    return config
