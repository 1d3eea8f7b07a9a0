"""A real Slurm cluster on localhost for tests: one munged, one slurmctld, several slurmd.

Debian's slurm-wlm (22.05) is built with multiple-slurmd support, so one host can run
`slurmd -N gpu01`, `slurmd -N gpu02`, ... each on its own port. Everything lives in a
private folder: its own munge socket and key (so it never touches a system munged that other
tests or engineers may run), its own slurm.conf (clients find it through SLURM_CONF), free
ports chosen at start. GPUs are declared as GRES with AutoDetect=off and no device files,
which Slurm accepts for scheduling and accounting without real GPUs.

With ``accounting=True`` the cluster also runs its own slurmdbd (Debian's slurmdbd and
slurm-wlm-mysql-plugin) storing into the machine's MariaDB (127.0.0.1:3306, root, no password)
in a database of its own (``slurm_acct_<random>``, dropped at stop), so parallel runs never share
rows; ``sacct`` and ``sstat`` then answer for its jobs (jobacct_gather/linux).

Usage (see tests/inventory/test_slurm_sync.py):

    with SlurmCluster(tmp_path, nodes=["gpu01", "gpu02"], accounting=True) as cluster:
        job = cluster.sbatch("sleep 300", nodelist="gpu01", gpus=1)
        cluster.run("squeue", "--json")
        cluster.run("sacct", "-j", job, "--json")
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

from tests.helpers import wait_for

COMMAND_TIMEOUT = 30
REQUIRED = ("munged", "slurmctld", "slurmd", "sinfo", "squeue", "sbatch", "scontrol")
ACCOUNTING_REQUIRED = ("slurmdbd", "sacct", "sacctmgr", "mysql")
MARIADB = {"host": "127.0.0.1", "port": "3306", "user": "root"}


def missing_binaries(names: Iterable[str] = REQUIRED) -> list[str]:
    extra = ("/usr/sbin",)
    path = os.pathsep.join([os.environ.get("PATH", ""), *extra])
    return [name for name in names if shutil.which(name, path=path) is None]


def _mysql(sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["mysql", "-h", MARIADB["host"], "-P", MARIADB["port"], "-u", MARIADB["user"], "-e", sql],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False,
    )


def can_run_slurm(accounting: bool = False) -> tuple[bool, str]:
    """(ok, reason): the daemons need root (munged's key checks, slurmd's spool) and the packages."""
    missing = missing_binaries(REQUIRED + (ACCOUNTING_REQUIRED if accounting else ()))
    if missing:
        return False, (
            f"Slurm is not installed (missing {', '.join(missing)}): run `sudo bash scripts/install-system-deps.sh` "
            "(apt packages slurm-wlm slurm-client munge, and slurmdbd slurm-wlm-mysql-plugin mariadb-server for "
            "accounting)"
        )
    if os.geteuid() != 0:
        return False, "the local Slurm cluster needs root (munged and slurmd): run the tests as root, as CI does"
    if accounting:
        probe = _mysql("SELECT 1")
        if probe.returncode != 0:
            return False, (
                f"Slurm accounting needs MariaDB on {MARIADB['host']}:{MARIADB['port']} (user root, no password): "
                f"start it (`service mariadb start`, as .ci/run does): {probe.stderr.strip()[-200:]}"
            )
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
        accounting: bool = False,
        reboot_program: str = "",
        gres_type: str = "",
        job_file_append: int | None = None,
    ) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        # node name -> comma-separated features, e.g. {"gpu01": "nvdriver_570.86.15,h100"}
        self.features = dict(features or {})
        self.cluster_name = cluster_name
        # The site's shape: typed GRES (gpu:<type>:N) or untyped (gpu:N); JobFileAppend as written in
        # slurm.conf (None: not written, Slurm's default 0, which truncates a requeued job's output).
        self.gres_type = gres_type
        self.job_file_append = job_file_append
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.sock"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._slurmd: dict[str, subprocess.Popen[bytes]] = {}
        self._ctld: subprocess.Popen[bytes] | None = None
        self._munged_pid: int | None = None
        self.accounting = accounting
        # What slurmd runs for `scontrol reboot` (Slurm refuses the command without one).
        self.reboot_program = reboot_program
        # One database per cluster instance: parallel test runs never see each other's jobs.
        self.accounting_db = f"slurm_acct_{uuid.uuid4().hex[:12]}" if accounting else ""
        self._dbd: subprocess.Popen[bytes] | None = None
        ports = _free_ports(len(self.nodes) + 2)
        self.ctld_port, self.dbd_port = ports[0], ports[1]
        self.node_ports = dict(zip(self.nodes, ports[2:], strict=True))

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
            f"CPUs={self.cpus_per_node} RealMemory=1000 Gres={self.gres} State=UNKNOWN"
        )
        if self.features.get(name):
            line += f" Feature={self.features[name]}"
        return line

    @property
    def gres(self) -> str:
        return f"gpu:{self.gres_type}:{self.gpus_per_node}" if self.gres_type else f"gpu:{self.gpus_per_node}"

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
            *self._accounting_lines(),
            *([] if self.accounting else ["JobCompType=jobcomp/none"]),
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=2",
            "GresTypes=gpu",
            *([f"RebootProgram={self.reboot_program}"] if self.reboot_program else []),
            *([f"JobFileAppend={self.job_file_append}"] if self.job_file_append is not None else []),
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
            + "".join(f"NodeName={n} Name=gpu{f' Type={self.gres_type}' if self.gres_type else ''} "
                      f"Count={self.gpus_per_node} File={files}\n" for n in active)
        )
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        if self.accounting:
            self._write_dbd_conf()

    def _accounting_lines(self) -> list[str]:
        if not self.accounting:
            return ["JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none"]
        return [
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=5",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={self.munge_socket}",
            "JobCompType=jobcomp/none",
        ]

    def _write_dbd_conf(self) -> None:
        conf = self.root / "slurmdbd.conf"
        conf.write_text("\n".join([
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}",
            "SlurmUser=root",
            f"LogFile={self.root}/slurmdbd.log",
            f"PidFile={self.root}/slurmdbd.pid",
            "DebugLevel=info",
            "StorageType=accounting_storage/mysql",
            f"StorageHost={MARIADB['host']}",
            f"StoragePort={MARIADB['port']}",
            f"StorageUser={MARIADB['user']}",
            f"StorageLoc={self.accounting_db}",
        ]) + "\n")
        os.chmod(conf, 0o600)  # slurmdbd refuses a configuration others can read

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
        env = self.env
        if args[0] == "slurmdbd":
            env["SLURM_CONF"] = str(self.conf)  # slurmdbd.conf is found beside it
        proc = subprocess.Popen(
            list(args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._procs.append(proc)
        return proc

    def start_slurmd(self, name: str) -> None:
        self._slurmd[name] = self._spawn("slurmd", "-D", "-N", name, "-f", str(self.conf))

    def restart_slurmd_script(self, name: str) -> Path:
        """A script that restarts node `name`'s slurmd: what a modelled reboot runs on this one host.

        A real reboot also gives the node a new boot time, which is what Slurm 22.05 waits for to
        complete `scontrol reboot`; on one host that cannot happen, so tests reboot through the agent.
        """
        script = self.root / f"restart-slurmd-{name}.sh"
        pid_file = self.root / f"slurmd-{name}.pid"
        script.write_text(
            "#!/bin/sh\n"
            f"export SLURM_CONF={self.conf}\n"
            f"pid=$(cat {pid_file} 2>/dev/null)\n"
            'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; '
            'for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; fi\n'
            f"exec /usr/sbin/slurmd -N {name} -f {self.conf}\n"
        )
        script.chmod(0o755)
        return script

    def stop_slurmd(self, name: str) -> None:
        proc = self._slurmd.pop(name, None)
        if proc is not None:
            self._terminate(proc)

    def _start_slurmdbd(self) -> None:
        self._dbd = self._spawn("slurmdbd", "-D", "-s")
        env_conf = {"SLURM_CONF": str(self.conf)}

        def answering() -> bool:
            # sacctmgr reaches slurmdbd through slurm.conf's AccountingStorageHost/Port.
            done = subprocess.run(["sacctmgr", "-n", "list", "cluster"], env={**self.env, **env_conf},
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
            return done.returncode == 0

        if not wait_for(answering, 60, interval=0.5):
            raise RuntimeError(f"slurmdbd did not answer; logs in {self.root}:\n{self.logs()}")
        # slurmctld registers with the cluster's association; make it before the controller starts.
        self.run("sacctmgr", "-i", "add", "cluster", self.cluster_name, check=False)

    def start(self) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_conf()
        self._start_munged()
        if self.accounting:
            try:
                self._start_slurmdbd()
            except BaseException:
                self.stop()
                raise
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
        self._dbd = None
        # slurmd daemons restarted by a modelled reboot (restart_slurmd_script) are not our children.
        for pid_file in self.root.glob("slurmd-*.pid"):
            self._kill_own_daemon(pid_file)
        if self._munged_pid:
            try:
                os.kill(self._munged_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._munged_pid = None
        # Job step daemons (slurmstepd) of our jobs are children of slurmd's session; kill leftovers.
        self._kill_leftover_steps()
        if self.accounting_db:
            _mysql(f"DROP DATABASE IF EXISTS `{self.accounting_db}`")

    def _kill_own_daemon(self, pid_file: Path) -> None:
        """Stop the daemon a pid file names, only if it runs with this cluster's slurm.conf (pids get reused)."""
        try:
            pid = int(pid_file.read_text().strip() or 0)
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return
        if str(self.conf).encode() not in argv:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if not wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, interval=0.1):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def sacct(self, *args: str) -> list[dict[str, str]]:
        """`sacct` rows (every run of a job, requeued ones included) as dictionaries of its columns."""
        fields = "JobID,JobName,State,NodeList,Start,End,ExitCode"
        out = self.run("sacct", "-X", "-D", "-n", "-P", f"--format={fields}", *args)
        names = fields.split(",")
        return [dict(zip(names, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]

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
    def output_of(self, job_id: str) -> Path:
        """The job's output file (stdout and stderr): a real file, as at a site."""
        return self.root / "output" / f"job-{job_id}.out"

    def sbatch(self, command: str, *, nodelist: str | None = None, gpus: int = 0, name: str = "job",
               time_limit: str = "01:00:00", nodes: int = 1, open_mode: str = "") -> str:
        """Submit a batch job; `gpus` is per node, `open_mode` sbatch's --open-mode (append or truncate; none:
        the site's JobFileAppend). Returns the job id; its output goes to ``output_of(job_id)``."""
        (self.root / "output").mkdir(exist_ok=True)
        args = ["sbatch", "--parsable", f"--job-name={name}", f"--time={time_limit}", f"--chdir={self.root}",
                f"--output={self.root}/output/job-%j.out", f"--nodes={nodes}",
                *([f"--open-mode={open_mode}"] if open_mode else [])]
        if nodelist:
            args.append(f"--nodelist={nodelist}")
        if gpus:
            args.append(f"--gres=gpu:{gpus}")  # untyped: a job asks for any GPU model, typed GRES or not
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
