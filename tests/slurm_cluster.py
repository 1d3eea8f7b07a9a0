"""A real Slurm cluster on localhost for tests: one munged, one slurmctld, several slurmd.

Debian's slurm-wlm (22.05) is built with multiple-slurmd support, so one host can run
`slurmd -N gpu01`, `slurmd -N gpu02`, ... each on its own port. Everything lives in a
private folder: its own munge socket and key (so it never touches a system munged that other
tests or engineers may run), its own slurm.conf (clients find it through SLURM_CONF), free
ports chosen at start. GPUs are declared as GRES with AutoDetect=off and no device files,
which Slurm accepts for scheduling and accounting without real GPUs.

Usage (see tests/inventory/test_slurm_sync.py):

    with SlurmCluster(tmp_path, nodes=["gpu01", "gpu02"]) as cluster:
        cluster.sbatch("sleep 300", nodelist="gpu01", gpus=1)
        cluster.run("squeue", "--json")
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

from tests.helpers import wait_for

COMMAND_TIMEOUT = 30
REQUIRED = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scontrol")


def missing_binaries() -> list[str]:
    extra = ("/usr/sbin",)
    path = os.pathsep.join([os.environ.get("PATH", ""), *extra])
    return [name for name in REQUIRED if shutil.which(name, path=path) is None]


def can_run_slurm() -> tuple[bool, str]:
    """(ok, reason): the daemons need root (munged's key checks, slurmd's spool) and the packages."""
    missing = missing_binaries()
    if missing:
        return False, (
            f"Slurm is not installed (missing {', '.join(missing)}): "
            "run `sudo bash scripts/install-system-deps.sh` (apt packages slurm-wlm slurm-client munge)"
        )
    if os.geteuid() != 0:
        return False, "the local Slurm cluster needs root (munged and slurmd): run the tests as root, as CI does"
    return True, ""


def _free_ports(count: int) -> list[int]:
    """`count` consecutive free TCP ports (slurm.conf takes a node port range)."""
    for _attempt in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count >= 65000:
            continue
        ok = True
        for port in range(base, base + count):
            with socket.socket() as sock:
                try:
                    sock.bind(("0.0.0.0", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return list(range(base, base + count))
    raise RuntimeError("no run of free TCP ports found for the Slurm test cluster")


class SlurmCluster:
    def __init__(
        self,
        root: Path,
        nodes: Sequence[str] = ("gpu01", "gpu02", "gpu03", "gpu04"),
        gpus_per_node: int = 4,
        cpus_per_node: int = 4,
        features: dict[str, str] | None = None,
        cluster_name: str = "gpusweeptest",
    ) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        # node name -> comma-separated features, e.g. {"gpu01": "nvdriver_570.86.15,h100"}
        self.features = dict(features or {})
        self.cluster_name = cluster_name
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.sock"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._ctld: subprocess.Popen[bytes] | None = None
        self._munged_pid: int | None = None
        ports = _free_ports(len(self.nodes) + 1)
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:], strict=True))

    # --- environment -------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), "/usr/sbin"])
        return env

    def run(self, *args: str, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> str:
        result = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"`{' '.join(args)}` exited {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    # --- configuration -----------------------------------------------------------------
    def _node_line(self, name: str) -> str:
        line = (
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[name]} "
            f"CPUs={self.cpus_per_node} RealMemory=1000 Gres=gpu:{self.gpus_per_node} State=UNKNOWN"
        )
        if self.features.get(name):
            line += f" Feature={self.features[name]}"
        return line

    def write_conf(self, nodes: Iterable[str] | None = None) -> None:
        active = list(nodes) if nodes is not None else self.nodes
        state = self.root / "state"
        spool = self.root / "spool"
        state.mkdir(parents=True, exist_ok=True)
        for name in self.nodes:
            (spool / name).mkdir(parents=True, exist_ok=True)
        lines = [
            f"ClusterName={self.cluster_name}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={state}",
            f"SlurmdSpoolDir={spool}/%n",
            f"SlurmctldPidFile={self.root}/slurmctld.pid",
            f"SlurmdPidFile={self.root}/slurmd-%n.pid",
            f"SlurmctldLogFile={self.root}/slurmctld.log",
            f"SlurmdLogFile={self.root}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            "GresTypes=gpu",
            # Trust slurm.conf for CPUs and GRES: the test host has no GPUs and only a few cores.
            "SlurmdParameters=config_overrides",
            *[self._node_line(name) for name in active],
            f"PartitionName=gpu Nodes={','.join(active)} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        # Plain files stand in for /dev/nvidiaN: Slurm only needs a path per GPU to bind jobs to.
        dev = self.root / "dev"
        dev.mkdir(exist_ok=True)
        for index in range(self.gpus_per_node):
            (dev / f"nvidia{index}").touch()
        files = f"{dev}/nvidia[0-{self.gpus_per_node - 1}]"
        (self.root / "gres.conf").write_text(
            "AutoDetect=off\n"
            + "".join(f"NodeName={n} Name=gpu Count={self.gpus_per_node} File={files}\n" for n in active)
        )
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    # --- daemons -----------------------------------------------------------------------
    def _start_munged(self) -> None:
        munge_dir = self.munge_socket.parent
        munge_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(munge_dir, 0o700)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        pid_file = munge_dir / "munged.pid"
        # munged refuses group/world-writable parents unless forced; tmp folders are 1777.
        subprocess.run(
            [
                "munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                f"--pid-file={pid_file}", f"--log-file={munge_dir / 'munged.log'}",
                f"--seed-file={munge_dir / 'munged.seed'}",
            ],
            env=self.env, check=True, timeout=COMMAND_TIMEOUT, capture_output=True,
        )
        self._munged_pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 10) or 0)

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            list(args), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._procs.append(proc)
        return proc

    def start_slurmd(self, name: str) -> None:
        self._slurmd[name] = self._spawn("slurmd", "-D", "-N", name, "-f", str(self.conf))

    def stop_slurmd(self, name: str) -> None:
        proc = self._slurmd.pop(name, None)
        if proc is not None:
            self._terminate(proc)

    def start(self) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_conf()
        self._start_munged()
        self._ctld = self._spawn("slurmctld", "-D", "-c", "-i", "-f", str(self.conf))
        for name in self.nodes:
            self.start_slurmd(name)
        if not wait_for(self._all_idle, 60, interval=1):
            self.stop()
            raise RuntimeError(f"Slurm test cluster did not come up; logs in {self.root}:\n{self.logs()}")
        return self

    def _all_idle(self) -> bool:
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10, check=False)
        except subprocess.TimeoutExpired:
            return False
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(name, "").startswith("idle") for name in self.nodes)

    def logs(self) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))
        return "\n".join(parts)

    def reconfigure(self, nodes: Sequence[str]) -> None:
        """Keep only `nodes` in slurm.conf. Removing nodes needs a slurmctld restart in 22.05."""
        for name in set(self.nodes) - set(nodes):
            self.stop_slurmd(name)
        self.write_conf(nodes)
        if self._ctld is not None:
            self._terminate(self._ctld)
        self._ctld = self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        wait_for(lambda: self.run("sinfo", "-h", timeout=10, check=False).strip() != "", 30, interval=1)

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop(self) -> None:
        try:
            self.run("scancel", "--full", "-u", "root", timeout=10, check=False)
        except (subprocess.TimeoutExpired, OSError):
            pass
        for proc in reversed(self._procs):
            self._terminate(proc)
        self._procs.clear()
        self._slurmd.clear()
        self._ctld = None
        if self._munged_pid:
            try:
                os.kill(self._munged_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._munged_pid = None
        # Job step daemons (slurmstepd) of our jobs are children of slurmd's session; kill leftovers.
        self._kill_leftover_steps()

    def _kill_leftover_steps(self) -> None:
        """Kill processes still running with our SLURM_CONF (job steps of this cluster only)."""
        marker = f"SLURM_CONF={self.conf}".encode()
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                env = (proc_dir / "environ").read_bytes()
            except OSError:
                continue
            if marker in env.split(b"\0"):
                try:
                    os.kill(int(proc_dir.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- jobs --------------------------------------------------------------------------
    def sbatch(self, command: str, *, nodelist: str | None = None, gpus: int = 0, name: str = "job",
               time_limit: str = "01:00:00", nodes: int = 1) -> str:
        """Submit a batch job; `gpus` is per node. Returns the job id."""
        args = ["sbatch", "--parsable", f"--job-name={name}", f"--time={time_limit}", f"--chdir={self.root}",
                "--output=/dev/null", f"--nodes={nodes}"]
        if nodelist:
            args.append(f"--nodelist={nodelist}")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        args.append(f"--wrap={command}")
        return self.run(*args).strip().split(";")[0]

    def wait_running(self, job_ids: Sequence[str], timeout: float = 60) -> bool:
        def running() -> bool:
            out = self.run("squeue", "-h", "-o", "%i %T", timeout=10, check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return all(states.get(job) == "RUNNING" for job in job_ids)

        return bool(wait_for(running, timeout, interval=1))

    def wait_ended(self, job_id: str, timeout: float = 60) -> bool:
        """True once the job no longer holds its node (gone from squeue, or in a final state)."""

        def ended() -> bool:
            out = self.run("squeue", "-h", "-j", job_id, "-o", "%T", timeout=10, check=False).strip()
            return out in ("", "CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL")

        return bool(wait_for(ended, timeout, interval=0.5))
