"""The agent's behaviour, independent of HTTP: facts, workloads, and the operations behind /v1."""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import __version__, transfer
from .artifacts import (
    LAZY_DECISION,
    LAZY_REPORT,
    ArtifactError,
    GrowingFileHasher,
    LocalArtifactStore,
    fingerprint,
    fingerprint_differences,
    new_checkpoint_id,
    requirement_differences,
)
from .config import AgentConfig
from .engines import CheckpointEngine, EngineError, get_engine, lazy
from .engines.base import SECRET_WORDS
from .engines.criu import (
    CriuEngine,
    container_process,
    has_tcp_connections,
    kill_tree,
    ns_pid,
    processes_mentioning,
    resume_tree,
)
from .facts import Facts, gather
from .health import HealthRequest, run_checks
from .operations import OperationDeferred, OperationError, OperationStore
from .packages import PackageError, get_package_manager, patterns_for
from .patch import OS_PACKAGES, PatchError, PatchMethod, get_patch_method, validate
from .replay import NonceLog
from .util import host_argv, pid_alive, read_json, reap, utcnow, write_json_atomic
from .workloads import (
    WORKLOAD_ID_RE,
    WorkloadRegistry,
    discover_cgroup_workloads,
    gpu_users,
    listed,
    public,
)

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
FACTS_TTL_S = 10.0
# Workload fields a checkpoint carries to the node that restores it.
CARRIED = ("id", "kind", "scheduler_id", "name", "gpus", "started_at", "checkpoint_engine", "checkpoint_signal",
           "engine", "engine_version", "model_name", "model_version", "command", "cwd", "env", "checkpoint_dir")
# Operations that finish at once answer 200 with the finished record; the rest 202.
INLINE_KINDS = ("maintenance",)


def saved_steps(manifest: dict[str, Any]) -> int | None:
    """The step a restored workload resumes from, as the application itself reported it: the ``step``
    (or ``steps``) of its signal engine acknowledgement (the demo counter writes ``{"step": N}``);
    None when it reported none."""
    ack = (manifest.get("engine_data") or {}).get("ack")
    steps = next((ack[k] for k in ("steps", "step") if k in ack), None) if isinstance(ack, dict) else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


class Agent:
    def __init__(self, config: AgentConfig, argv: list[str] | None = None) -> None:
        self.config = config
        self.argv = argv or []
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.operations = OperationStore(config.state_dir)
        # Nonces of accepted requests, so a captured request cannot be sent again (replay.py).
        self.nonces = NonceLog(config.state_dir / "nonces.log")
        self.artifacts = LocalArtifactStore(config.artifact_dir)
        self.workloads = WorkloadRegistry(config.state_dir)
        self.shares = transfer.Shares(config.state_dir)
        self._facts: tuple[float, Facts] | None = None
        self._stop = threading.Event()
        self.restart_requested = threading.Event()
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        # Lazy moves' two-phase release: one decision at a time; when the receiver was last heard from
        # (monotonic); the mailbox reports seen and answers read; the receiver's report numbers.
        self._lazy_lock = threading.RLock()
        self._lazy_heard: dict[str, float] = {}
        self._lazy_seen: dict[str, Any] = {}
        self._lazy_acks: dict[str, Any] = {}
        self._lazy_seq = itertools.count(1)
        become_subreaper()

    # ----- facts, health, workloads -----

    def facts(self, fresh: bool = False) -> Facts:
        if fresh or self._facts is None or time.monotonic() - self._facts[0] > FACTS_TTL_S:
            self._facts = (time.monotonic(), gather(self.config))
        return self._facts[1]

    def holders(self) -> dict[str, dict[str, str]]:
        """Who holds the node in maintenance: {owner: {"since", "reason"}} (no owner given: "operator")."""
        data = read_json(self.config.state_dir / "maintenance.json", {}) or {}
        if "holders" in data:
            return dict(data["holders"])
        # The form before owners: one flag.
        return {"operator": {"since": str(data.get("since", "")), "reason": ""}} if data.get("enabled") else {}

    @property
    def maintenance(self) -> bool:
        return bool(self.holders())

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "node": self.config.identity, "agent_version": __version__,
                "maintenance": self.maintenance, "maintenance_holders": self.holders()}

    def list_workloads(self) -> list[dict[str, Any]]:
        registered = self.workloads.refreshed()
        known_pids = {int(w.get("pid") or 0) for w in registered}
        out = [listed(w) for w in registered]
        for found in self._scheduler_workloads() + self._gpu_processes():
            if found["pid"] not in known_pids:
                out.append({**public(found), "id": found["id"]})
        return out

    def _scheduler_workloads(self) -> list[dict[str, Any]]:
        """Slurm steps of this node and pods, by cgroup (unless the configuration says it runs neither)."""
        return discover_cgroup_workloads(node=self.config.node) if self.config.scheduler_workloads else []

    def gpu_users(self) -> list[dict[str, Any]]:
        """Every process holding a GPU on this node, with its owner (workloads.gpu_users)."""
        users = gpu_users(self.config.gpu_devices, list(self.workloads.all().values()))
        for user in users:
            # Names as /proc/<pid>/comm gives them (15 characters at most).
            user["system"] = user["name"] in self.config.gpu_system_processes
        # The agent itself may hold a device while a health check reads NVML.
        return [u for u in users if u["pid"] != os.getpid()]

    def _gpu_processes(self) -> list[dict[str, Any]]:
        """Bare processes holding a GPU that no scheduler and no registration accounts for, as workloads:
        the campaign's workload policy then checkpoints (cuda), stops or waits for them."""
        found = []
        for user in self.gpu_users():
            if user["owner"]["kind"] != "process" or user["workload_id"] or user["system"]:
                continue
            gpus = sum(1 for d in user["devices"] if re.fullmatch(r".*/nvidia\d+", d)) or 1
            found.append({"id": f"gpu-pid-{user['pid']}", "kind": "gpu_process", "scheduler_id": str(user["pid"]),
                          "name": user["name"], "pid": user["pid"], "gpus": gpus, "state": "running",
                          "checkpoint_engine": "cuda"})
        return found

    def find_workload(self, workload_id: str) -> dict[str, Any]:
        workload = self.workloads.get(workload_id)
        if workload is None:
            for found in self._scheduler_workloads() + self._gpu_processes():
                if found["id"] == workload_id:
                    return found
            raise OperationError(f"unknown workload {workload_id!r} on {self.config.identity}")
        return workload

    # ----- operations -----

    def submit(self, kind: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create (or find) the operation for a mutating call and start it; return (record, created)."""
        op_id = str(body.get("operation_id") or "")
        params = {k: v for k, v in body.items() if k != "operation_id"}
        self.validate(kind, params)
        record, created = self.operations.create(op_id, kind, params)
        if created:
            runner = getattr(self, f"run_{kind}")
            self.operations.run(op_id, runner, background=kind not in INLINE_KINDS)
            record = self.operations.get(op_id) or record
        return record, created

    def validate(self, kind: str, params: dict[str, Any]) -> None:
        """Reject a malformed request before anything is written (the caller answers 400)."""
        required = {"checkpoint": ("workload_id",), "restore": ("checkpoint_id",), "maintenance": ("enabled",),
                    "share": ("checkpoint_id", "to"), "fetch": ("checkpoint_id", "source", "token", "sha256"),
                    "patch": ("component", "version", "method"), "reboot": (), "register": ("workload_id", "pid"),
                    "health_check": (), "rollback": ()}
        missing = [k for k in required[kind] if params.get(k) in (None, "")]
        if missing:
            raise ValueError(f"{kind}: missing {', '.join(missing)}")
        if kind == "patch":
            try:
                validate(str(params["component"]), str(params["version"]), params.get("packages"))
            except PatchError as exc:
                raise ValueError(str(exc)) from None
        if kind == "checkpoint" and not isinstance(params.get("requires", {}), dict):
            raise ValueError("checkpoint: requires must be an object")
        if kind == "checkpoint" and not isinstance(params.get("lazy_pages", False), bool):
            raise ValueError("checkpoint: lazy_pages must be true or false")
        if kind == "maintenance" and not isinstance(params["enabled"], bool):
            raise ValueError("maintenance: enabled must be true or false")
        if kind == "maintenance" and not all(isinstance(params.get(k, ""), str) for k in ("owner", "reason")):
            raise ValueError("maintenance: owner and reason must be text")
        if kind == "register" and not WORKLOAD_ID_RE.match(str(params["workload_id"])):
            raise ValueError(f"register: bad workload_id {params['workload_id']!r}")
        if kind == "health_check":
            health_request(params)
        if kind in ("patch", "rollback") and not isinstance(params.get("owner", ""), str):
            raise ValueError(f"{kind}: owner must be text")

    def run_maintenance(self, record: dict[str, Any]) -> dict[str, Any]:
        """Take or give back a hold on the node. Each owner holds and releases only its own: the node
        admits work again when nobody holds it (a repair's hold outlives a campaign's)."""
        params = record["params"]
        owner = str(params.get("owner") or "operator")[:128]
        holders = self.holders()
        if params["enabled"]:
            holders.setdefault(owner, {"since": utcnow(), "reason": str(params.get("reason") or "")[:500]})
        else:
            holders.pop(owner, None)
        write_json_atomic(self.config.state_dir / "maintenance.json",
                          {"enabled": bool(holders), "since": utcnow(), "holders": holders})
        return {"maintenance": bool(holders), "holders": holders}

    def run_checkpoint(self, record: dict[str, Any]) -> dict[str, Any]:
        params = record["params"]
        workload = self.find_workload(str(params["workload_id"]))
        engine_name = str(params.get("engine") or workload.get("checkpoint_engine") or "criu")
        try:
            engine = get_engine(engine_name, self.config)
            engine.check()
        except EngineError as exc:
            raise OperationError(str(exc)) from None
        # One checkpoint of a workload at a time: a second CRIU on the same tree would fail or worse.
        with self._busy_lock:
            if workload["id"] in self._busy:
                raise OperationError(f"workload {workload['id']} is already being checkpointed")
            self._busy.add(workload["id"])
        try:
            return self._checkpoint(record, workload, engine, engine_name)
        finally:
            with self._busy_lock:
                self._busy.discard(workload["id"])

    def _checkpoint(
        self, record: dict[str, Any], workload: dict[str, Any], engine: CheckpointEngine, engine_name: str
    ) -> dict[str, Any]:
        params = record["params"]
        checkpoint_id = new_checkpoint_id()
        image_dir = self.artifacts.image_dir(checkpoint_id)
        self.operations.update(record["id"], progress={"checkpoint_id": checkpoint_id, "engine": engine_name,
                                                        "workload": workload, "phase": "checkpointing"})

        def progress(**fields: Any) -> None:
            current = (self.operations.get(record["id"]) or {}).get("progress", {})
            self.operations.update(record["id"], progress={**current, **fields})

        leave_running = bool(params.get("leave_running"))
        lazy_because = ""
        if bool(params.get("lazy_pages", self.config.criu_lazy_pages)) and not leave_running:
            # The plain criu engine only: cuda's GPU memory is not served page by page.
            lazy_because = lazy.lazy_pages_missing(self.config.criu) if type(engine) is CriuEngine else \
                f"the {engine_name} engine moves no pages lazily"
            if not lazy_because and has_tcp_connections(int(workload.get("pid") or 0)):
                # --tcp-established locks its connections, and CRIU lifts the lock on the source only when
                # the dump fails: a copy the two-phase release resumes would find them locked.
                lazy_because = "the workload holds a connected TCP socket (its copy could not resume on the source)"
            if not lazy_because:
                assert isinstance(engine, CriuEngine)
                return self._checkpoint_lazy(record, workload, engine, checkpoint_id, progress)
        try:
            with GrowingFileHasher(image_dir) as hasher:
                engine_data = engine.checkpoint(workload, image_dir, leave_running, progress)
                # While the hasher catches up on the other core.
                self._make_durable(checkpoint_id, workload)
        except EngineError as exc:
            self.artifacts.discard(checkpoint_id)
            alive = pid_alive(int(workload.get("pid") or 0))
            raise OperationError(str(exc), {"workload_state": "running" if alive else "exited"}) from None
        if lazy_because:
            engine_data["lazy_because"] = lazy_because
        return self._finish_checkpoint(record["id"], workload, engine_name, checkpoint_id, engine_data, leave_running,
                                       hasher.digests(), params.get("requires"))

    # ----- lazy moves (engines/lazy.py) -----
    #
    # The two-phase release. The source's CRIU serves the pages and, when its page server ends, leaves the
    # workload stopped (--leave-stopped); a failed stream thaws it (CRIU). The receiver's agent reports to
    # the source's agent (POST /v1/lazy/<checkpoint>/report with the share's token, or the mailbox files
    # in a store both share): "streaming" while its daemon works, then "complete" (every page is in the
    # restored process) or "failed" (its copy already killed). The source decides once, under a lock,
    # writes the decision before it acts on it, and answers every report with it: "released" (its
    # stopped copy killed) only on the receiver's "complete" after its own page server ended complete;
    # "resumed" (its copy thawed, `resumed_on_source`) on a failed stream, the receiver's "failed", or
    # no word from the receiver for lazy_release_timeout_s. The receiver keeps its copy only on
    # "released"; it kills it on "resumed" and when it has had no answer for half that time, before the
    # source could resume. Both sides' state is in state_dir/lazy, so a restarted agent carries on.

    def _checkpoint_lazy(self, record: dict[str, Any], workload: dict[str, Any], engine: CriuEngine,
                         checkpoint_id: str, progress: Any) -> dict[str, Any]:
        """Seal the images but the memory; CRIU serves the pages from the frozen workload, which then
        waits, stopped, for the receiver's word (the two-phase release above)."""
        address = self.config.lazy_pages_address or self.config.listen
        started = time.monotonic()
        try:
            engine_data, dump, log = engine.checkpoint_lazy(workload, self.artifacts.image_dir(checkpoint_id),
                                                            address, free_port(address), progress)
        except EngineError as exc:
            self.artifacts.discard(checkpoint_id)
            alive = pid_alive(int(workload.get("pid") or 0))
            raise OperationError(str(exc), {"workload_state": "running" if alive else "exited"}) from None
        # Not fsynced: without its pages, which live only in the source's frozen process, the image
        # cannot outlive this node's CRIU, so a flush would only lengthen the pause.
        result = self._finish_checkpoint(record["id"], workload, "criu", checkpoint_id, engine_data, False,
                                         requires=record["params"].get("requires"))
        if self.workloads.get(workload["id"]) is not None:
            self.workloads.update(workload["id"], state="serving_pages")
        pid = int(workload["pid"])
        sealed = round(time.monotonic() - started, 3)
        # What a restarted agent needs to take the watch up again (recover()).
        self._write_lazy(checkpoint_id, "source", {
            "state": "serving", "sealed_s": sealed, "workload_id": workload["id"], "pid": pid,
            "pid_started": lazy.start_time(pid), "dump_pid": dump.pid, "dump_started": lazy.start_time(dump.pid),
            "log": str(log), "release_timeout_s": self.config.lazy_release_timeout_s})
        threading.Thread(target=self._watch_lazy_source, args=(checkpoint_id, dump, log, started),
                         name=f"lazy-source-{checkpoint_id}", daemon=True).start()
        return result

    def _watch_lazy_source(self, checkpoint_id: str, dump: Any, log: Path, started: float) -> None:
        while dump.poll() is None:
            self._read_lazy_mailbox(checkpoint_id)  # a receiver on a shared store is heard while it streams
            time.sleep(0.05)
        self._lazy_source_ended(checkpoint_id, lazy.outcome(dump, log, started))

    def _lazy_source_ended(self, checkpoint_id: str, ended: dict[str, Any]) -> None:
        """CRIU's page server ended: decide at once on a failed stream, else wait for the receiver's word."""
        if ended["state"] == "failed":
            # CRIU thawed the workload when the stream broke: it runs on here, the receiver kills its copy.
            self._write_lazy(checkpoint_id, "source", {"page_server": ended})
            self._decide_lazy_source(checkpoint_id, "resumed", f"the page server failed: {ended.get('error', '')}")
            return
        self._write_lazy(checkpoint_id, "source", {"state": "awaiting_receiver", "page_server": ended})
        timeout = self.config.lazy_release_timeout_s
        with self._lazy_lock:
            self._lazy_heard[checkpoint_id] = max(self._lazy_heard.get(checkpoint_id, 0.0), time.monotonic())
        while True:
            self._read_lazy_mailbox(checkpoint_id)
            if self._settle_lazy_source(checkpoint_id) != "pending":
                return
            with self._lazy_lock:
                quiet = time.monotonic() - self._lazy_heard[checkpoint_id]
            if quiet > timeout:
                self._decide_lazy_source(checkpoint_id, "resumed",
                                         f"no word from the receiver for {timeout:g} s after the page server ended")
                return
            time.sleep(0.05)

    def _read_lazy_mailbox(self, checkpoint_id: str) -> None:
        """A receiver on a store both agents share reports in the checkpoint's folder: each new report counts
        like one over HTTP."""
        try:
            report = read_json(self.artifacts.image_dir(checkpoint_id) / LAZY_REPORT, None)
        except (ArtifactError, OSError, ValueError):
            return
        if isinstance(report, dict) and report.get("seq") != self._lazy_seen.get(checkpoint_id):
            self._lazy_seen[checkpoint_id] = report.get("seq")
            try:
                answer = self.lazy_report(checkpoint_id, str(report.get("state") or ""), str(report.get("node") or ""))
            except (LookupError, ValueError):
                return
            # The answer names the report it answers: the receiver counts it as word from this agent.
            try:
                write_json_atomic(self.artifacts.image_dir(checkpoint_id) / LAZY_DECISION,
                                  {"decision": answer["decision"], "seen": report.get("seq"), "at": utcnow()})
            except (ArtifactError, OSError):
                pass

    def lazy_report(self, checkpoint_id: str, state: str, node: str) -> dict[str, Any]:
        """The receiver's word on a lazy move this node serves (POST /v1/lazy/<checkpoint>/report): recorded,
        and answered with the source's decision ("pending" until there is one). Idempotent: the receiver's
        first final word stands and every later report gets the same decision."""
        if state not in ("streaming", "complete", "failed"):
            raise ValueError("lazy report: state must be streaming, complete or failed")
        with self._lazy_lock:
            source = (self.lazy_status(checkpoint_id) or {}).get("source")
            if not source:
                raise LookupError(f"no lazy move of {checkpoint_id} served here")
            self._lazy_heard[checkpoint_id] = time.monotonic()
            if state != "streaming" and not source.get("receiver_report"):
                self._write_lazy(checkpoint_id, "source", {"receiver_report": state, "receiver": node[:200]})
        return {"decision": self._settle_lazy_source(checkpoint_id),
                "state": (self.lazy_status(checkpoint_id) or {}).get("source", {}).get("state")}

    def _settle_lazy_source(self, checkpoint_id: str) -> str:
        """The decision on the source's copy, taken now if the receiver's word and the page server allow."""
        with self._lazy_lock:
            source = (self.lazy_status(checkpoint_id) or {}).get("source") or {}
            if source.get("decision"):
                if not source.get("applied"):
                    self._apply_lazy_decision(checkpoint_id, source)
                return str(source["decision"])
            report = source.get("receiver_report")
            if source.get("state") != "awaiting_receiver" or not report:
                return "pending"
            if report == "complete":
                return self._decide_lazy_source(checkpoint_id, "released", "the receiver has every page")
            return self._decide_lazy_source(checkpoint_id, "resumed", "the receiver's stream failed")

    def _decide_lazy_source(self, checkpoint_id: str, decision: str, because: str) -> str:
        """Record the decision (durably, first), then act on it; a decision already taken stands."""
        with self._lazy_lock:
            source = (self.lazy_status(checkpoint_id) or {}).get("source") or {}
            if source.get("decision"):
                decision = str(source["decision"])
            else:
                self._write_lazy(checkpoint_id, "source", {"decision": decision, "decided_because": because})
                try:
                    write_json_atomic(self.artifacts.image_dir(checkpoint_id) / LAZY_DECISION,
                                      {"decision": decision, "because": because, "at": utcnow(),
                                       "seen": self._lazy_seen.get(checkpoint_id)})
                except (ArtifactError, OSError):
                    pass  # the mailbox only; HTTP reports get the decision from the state file
            source = (self.lazy_status(checkpoint_id) or {}).get("source") or {}
            if not source.get("applied"):
                self._apply_lazy_decision(checkpoint_id, source)
            return decision

    def _apply_lazy_decision(self, checkpoint_id: str, source: dict[str, Any]) -> None:
        """Kill (released) or thaw (resumed) the source's copy: idempotent, and only the very process frozen."""
        pid = int(source.get("pid") or 0)
        ours = lazy.same_process(pid, str(source.get("pid_started") or ""))
        released = source.get("decision") == "released"
        if ours:
            (kill_tree if released else resume_tree)(pid)
        resumed = not released and ours and pid_alive(pid)
        workload_id = str(source.get("workload_id") or "")
        if self.workloads.get(workload_id) is not None:
            self.workloads.update(workload_id, state="checkpointed" if released else
                                  ("running" if resumed else "exited"))
        self._write_lazy(checkpoint_id, "source", {"applied": True, "state": "complete" if released else "failed",
                                                   "resumed_on_source": resumed,
                                                   "serving_s": (source.get("page_server") or {}).get("serving_s")})

    def _restore_lazy(self, engine: CriuEngine, manifest: dict[str, Any], checkpoint_id: str) -> int:
        pid, watch = engine.restore_lazy(manifest, self.artifacts.image_dir(checkpoint_id),
                                         self.config.state_dir / "restore" / checkpoint_id)
        daemon = watch["daemon"]
        # The backstop for a receiving agent that dies or hangs now: a process of its own kills the copy
        # when the agent has had no word from the source for as long as the agent itself would wait.
        lease = self._lazy_lease(checkpoint_id)
        lazy.touch(lease)
        watch["fence"] = subprocess.Popen(
            [sys.executable, "-m", "gpusweep_agent.engines.lazy", "fence", str(lease), str(pid),
             lazy.start_time(pid), str(self.config.lazy_release_timeout_s / 2)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._write_lazy(checkpoint_id, "receiver", {
            "state": "streaming", "restored_s": round(time.monotonic() - watch["started"], 3),
            "userfaultfds_held": len(watch["held"]), "pid": pid, "pid_started": lazy.start_time(pid),
            "daemon_pid": daemon.pid, "daemon_started": lazy.start_time(daemon.pid), "log": str(watch["log"]),
            "workload_id": str(manifest.get("workload", {}).get("id") or "")})
        threading.Thread(target=self._watch_lazy_receiver, args=(checkpoint_id, pid, watch),
                         name=f"lazy-receiver-{checkpoint_id}", daemon=True).start()
        return pid

    def _watch_lazy_receiver(self, checkpoint_id: str, pid: int, watch: dict[str, Any]) -> None:
        daemon = watch["daemon"]
        fence = self.config.lazy_release_timeout_s / 2
        last_ok = time.monotonic()
        said = 0.0
        while daemon.poll() is None:
            if time.monotonic() - said >= 1:
                said = time.monotonic()
                if self._tell_lazy_source(checkpoint_id, "streaming") is not None:
                    last_ok = time.monotonic()
                    lazy.touch(self._lazy_lease(checkpoint_id))
            if time.monotonic() - last_ok > fence:
                # The source's agent may resume its copy soon: this one goes first, with its daemon.
                kill_tree(pid)
                daemon.kill()
            time.sleep(0.05)
        rc = daemon.wait()
        seconds = round(time.monotonic() - watch["started"], 3)
        arrived, expected = lazy.transferred(watch["log"])
        complete = rc == 0 and expected > 0 and arrived == expected
        status: dict[str, Any] = {"pages_arrived": arrived, "pages_expected": expected, "daemon_exit": rc,
                                  ("all_pages_s" if complete else "failed_after_s"): seconds}
        if complete:
            status["all_pages_at"] = utcnow()
        else:
            status["error"] = lazy.log_tail(watch["log"])
        self._settle_lazy_receiver(checkpoint_id, pid, complete, status, last_ok)
        lazy.release(watch["held"])
        try:
            watch["fence"].wait(5)
        except subprocess.TimeoutExpired:
            pass  # the agent, subreaper, collects it later

    def _settle_lazy_receiver(self, checkpoint_id: str, pid: int, complete: bool, status: dict[str, Any],
                              last_ok: float) -> None:
        """Tell the source how the stream ended and keep the restored copy only if the source released its own."""
        if not complete and pid:
            # Its missing pages are gone with the stream: the copy here must not run on (the source's does),
            # and it goes before the source hears of it.
            kill_tree(pid)
        self._write_lazy(checkpoint_id, "receiver", {**status, "state": "releasing" if complete else "failing"})
        fence = self.config.lazy_release_timeout_s / 2
        decision = "pending"
        while decision == "pending" and time.monotonic() - last_ok <= fence:
            answer = self._tell_lazy_source(checkpoint_id, "complete" if complete else "failed")
            if answer is not None:
                last_ok = time.monotonic()
                decision = str(answer.get("decision") or "pending")
                lazy.touch(self._lazy_lease(checkpoint_id), "released" if decision == "released" else "")
            if decision == "pending":
                time.sleep(0.1)
        kept = complete and decision == "released"
        if complete and not kept and pid:
            kill_tree(pid)
            status["error"] = ("the source resumed its copy" if decision == "resumed" else
                               f"no decision from the source's agent within {fence:g} s")
        status.update(state="complete" if kept else "failed", source_decision=decision)
        if not kept:
            workload_id = str((self.lazy_status(checkpoint_id) or {}).get("receiver", {}).get("workload_id") or "")
            if self.workloads.get(workload_id) is not None:
                self.workloads.update(workload_id, state="exited")
        self._write_lazy(checkpoint_id, "receiver", status)

    def _lazy_lease(self, checkpoint_id: str) -> Path:
        return self.config.state_dir / "lazy" / f"{checkpoint_id}.lease"

    def _tell_lazy_source(self, checkpoint_id: str, state: str) -> dict[str, Any] | None:
        """Report to the source's agent: over HTTP to the agent the images were fetched from (with the share's
        token), else through the mailbox in the store both agents share. Its answer, or None without one."""
        peer = read_json(self.config.state_dir / "lazy-peers" / f"{checkpoint_id}.json", None)
        if isinstance(peer, dict) and peer.get("source"):
            return transfer.lazy_report(str(peer["source"]), checkpoint_id, str(peer.get("token") or ""),
                                        {"state": state, "node": self.config.identity})
        try:
            folder = self.artifacts.image_dir(checkpoint_id)
            decided = read_json(folder / LAZY_DECISION, None)
            write_json_atomic(folder / LAZY_REPORT, {"state": state, "node": self.config.identity,
                                                     "seq": f"{os.getpid()}-{next(self._lazy_seq)}", "at": utcnow()})
        except (ArtifactError, OSError, ValueError):
            return None
        if not isinstance(decided, dict):
            return None
        if decided.get("decision") in ("released", "resumed"):
            return decided
        # Word from the source's agent only when it has answered a report it had not answered before.
        if decided.get("seen") is None or decided.get("seen") == self._lazy_acks.get(checkpoint_id):
            return None
        self._lazy_acks[checkpoint_id] = decided.get("seen")
        return decided

    def _write_lazy(self, checkpoint_id: str, side: str, status: dict[str, Any]) -> None:
        path = self.config.state_dir / "lazy" / f"{checkpoint_id}.json"
        with self._busy_lock:
            current = read_json(path, {}) or {}
            # Each side's record grows: what it said while streaming stays beside how it ended.
            write_json_atomic(path, {**current, side: {**(current.get(side) or {}), **status, "at": utcnow()}})

    def lazy_status(self, checkpoint_id: str) -> dict[str, Any] | None:
        """A lazy move's progress as this node saw it (source: serving, complete or failed; receiver:
        streaming, complete with the pages and the seconds until all arrived, or failed); None otherwise."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", checkpoint_id):
            return None
        status: dict[str, Any] | None = read_json(self.config.state_dir / "lazy" / f"{checkpoint_id}.json", None)
        return status

    def _finish_checkpoint(
        self, op_id: str, workload: dict[str, Any], engine_name: str, checkpoint_id: str,
        engine_data: dict[str, Any], leave_running: bool, hashed: dict[str, tuple[int, int, str]] | None = None,
        requires: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        carried = {k: workload[k] for k in CARRIED if k in workload}
        carried.setdefault("checkpoint_engine", engine_name)
        fp = fingerprint(self.facts(), workload)
        manifest = self.artifacts.build_manifest(checkpoint_id, carried, engine_name, fp,
                                                 {**engine_data, "source_node": self.config.identity}, hashed)
        if isinstance(requires, dict):
            # What the service's portability rule says this image needs of a restore target.
            manifest["requires"] = requires
        self.artifacts.write_manifest(checkpoint_id, manifest)
        if self.workloads.get(workload["id"]) is not None:
            self.workloads.update(workload["id"], state="running" if leave_running else "checkpointed",
                                  checkpoint_id=checkpoint_id)
        return {"checkpoint_id": checkpoint_id, "manifest": manifest}

    def _make_durable(self, checkpoint_id: str, workload: dict[str, Any]) -> None:
        if not self.config.checkpoint_fsync:
            return
        try:
            self.artifacts.make_durable(checkpoint_id)
        except OSError as exc:
            # The images stay, unsealed (no manifest), for an operator; nothing restores them unverified.
            raise OperationError(
                f"checkpoint {checkpoint_id}: the images could not be written to stable storage ({exc}); "
                f"they are left unsealed in {self.artifacts.image_dir(checkpoint_id)}",
                {"workload_state": "running" if pid_alive(int(workload.get("pid") or 0)) else "exited",
                 "checkpoint_id": checkpoint_id},
            ) from None

    def _verify_for_restore(self, checkpoint_id: str) -> dict[str, Any]:
        try:
            manifest = self.artifacts.manifest(checkpoint_id)
        except ArtifactError as exc:
            raise OperationError(str(exc), {"error": "missing"}) from None
        if isinstance(manifest.get("requires"), dict):
            differences = requirement_differences(manifest["requires"], self.facts(fresh=True))
        else:  # a checkpoint taken for a service that sent no requirements: the full fingerprint
            target = fingerprint(self.facts(fresh=True), manifest.get("workload", {}))
            differences = fingerprint_differences(manifest.get("fingerprint", {}), target)
        if differences:
            report = ", ".join(f"{k}: {v['checkpoint']!r} != {v['target']!r}" for k, v in differences.items())
            raise OperationError(
                "incompatible",
                {"error": "incompatible", "differences": differences,
                 "message": f"checkpoint {checkpoint_id} cannot be restored on {self.config.identity}: {report}"},
            )
        try:
            return self.artifacts.verify(checkpoint_id)
        except ArtifactError as exc:
            raise OperationError(str(exc), {"error": "corrupted", "message": str(exc)}) from None

    def run_restore(self, record: dict[str, Any]) -> dict[str, Any]:
        if self.maintenance:
            raise OperationError(f"{self.config.identity} is in maintenance and admits no workloads")
        checkpoint_id = str(record["params"]["checkpoint_id"])
        try:
            into = container_process(record["params"])
        except EngineError as exc:
            raise OperationError(str(exc)) from None
        manifest = self._verify_for_restore(checkpoint_id)
        return self._restore(manifest, checkpoint_id, into)

    def _restore(self, manifest: dict[str, Any], checkpoint_id: str, into: int | None = None) -> dict[str, Any]:
        try:
            self.artifacts.claim(checkpoint_id, self.config.identity)
        except ArtifactError as exc:
            raise OperationError(str(exc), {"error": "claimed"}) from None
        workload = dict(manifest["workload"])
        try:
            engine = get_engine(manifest["engine"], self.config)
            if into is not None and is_lazy(manifest):
                raise EngineError("a lazy image restores on the agent's host only, not into a container")
            if is_lazy(manifest) and isinstance(engine, CriuEngine):
                pid = self._restore_lazy(engine, manifest, checkpoint_id)
            elif into is not None:
                if not isinstance(engine, CriuEngine):
                    raise EngineError(f"the {manifest['engine']} engine restores into no container (criu and cuda do)")
                pid = engine.restore(manifest, self.artifacts.image_dir(checkpoint_id),
                                     self.config.state_dir / "restore" / checkpoint_id, into=into)
            else:
                pid = engine.restore(manifest, self.artifacts.image_dir(checkpoint_id),
                                     self.config.state_dir / "restore" / checkpoint_id)
        except EngineError as exc:
            self.artifacts.release(checkpoint_id)
            raise OperationError(str(exc)) from None
        workload.update(pid=pid, state="running", restored_from=checkpoint_id, restored_at=utcnow())
        self.workloads.put(workload)
        self.artifacts.mark_restored(checkpoint_id, {"by": self.config.identity, "at": utcnow(), "pid": pid})
        answer = {"workload_id": workload["id"], "pid": pid, "checkpoint_id": checkpoint_id,
                  "cold_start": manifest["engine"] == "none"}
        if into is not None:
            # The container's own numbering: what its pid 1 (gpusweep-run, hold_restored) waits on.
            answer.update(container_pid=into, pid_in_container=ns_pid(pid))
        steps = saved_steps(manifest)
        return answer if steps is None or manifest["engine"] == "none" else {**answer, "steps": steps}

    def run_register(self, record: dict[str, Any]) -> dict[str, Any]:
        """A workload started through gpusweep-run: restore its pending checkpoint, or admit it fresh.

        A wrapper inside a scheduler's job (``restore_in_job``) restores a criu image itself, so the
        process comes back inside the job: it gets the command, then reports the restored pid
        (``restored_from``) or its failure (``failed``, which frees the checkpoint again)."""
        params = record["params"]
        if params.get("restored_from"):
            return self._adopt(params)
        if self.maintenance:
            raise OperationError(f"{self.config.identity} is in maintenance and admits no new workloads")
        params = record["params"]
        workload_id = str(params["workload_id"])
        pending = self.artifacts.pending_for(workload_id)
        if pending:
            try:
                manifest = self._verify_for_restore(pending)
            except OperationError as exc:
                if exc.result.get("error") != "incompatible":
                    raise
                # An invalid checkpoint means a cold start, said out loud; the checkpoint stays for a compatible node.
                return {"action": "start", "cold_start": True, **self._register(params), **exc.result}
            engine = get_engine(manifest["engine"], self.config)
            # A lazy image is restored by the agent, which watches its pages arrive.
            if engine.live and params.get("restore_in_job") and isinstance(engine, CriuEngine) \
                    and type(engine).after_restore is CriuEngine.after_restore and not is_lazy(manifest):
                try:
                    engine.check()
                    self.artifacts.claim(pending, self.config.identity)
                except (EngineError, ArtifactError) as exc:
                    raise OperationError(str(exc)) from None
                command, pidfile = engine.restore_args(manifest, self.artifacts.image_dir(pending),
                                                       self.config.state_dir / "restore" / pending)
                return {"action": "restore_in_job", "checkpoint_id": pending, "command": command,
                        "pidfile": str(pidfile)}
            if engine.live:
                return {"action": "restored", **self._restore(manifest, pending)}
            if manifest["engine"] == "signal":
                self.artifacts.claim(pending, self.config.identity)
                restore_dir = self.config.state_dir / "restore" / pending / "state"
                if restore_dir.exists():
                    shutil.rmtree(restore_dir)
                shutil.copytree(self.artifacts.image_dir(pending), restore_dir,
                                ignore=shutil.ignore_patterns("manifest.json", "claim.json"))
                self.artifacts.mark_restored(pending, {"by": self.config.identity, "at": utcnow(),
                                                       "pid": params["pid"]})
                return {"action": "resume", "checkpoint_id": pending, "restore_dir": str(restore_dir),
                        **self._register(params)}
            self.artifacts.claim(pending, self.config.identity)
            self.artifacts.mark_restored(pending, {"by": self.config.identity, "at": utcnow(), "pid": params["pid"]})
            return {"action": "start", "cold_start": True, "checkpoint_id": pending, **self._register(params)}
        return {"action": "start", "cold_start": False, **self._register(params)}

    def _adopt(self, params: dict[str, Any]) -> dict[str, Any]:
        """The wrapper restored a checkpoint inside its job: record the process, or free the checkpoint."""
        checkpoint_id = str(params["restored_from"])
        if self.artifacts.claimed_by(checkpoint_id) != self.config.identity:
            raise OperationError(f"checkpoint {checkpoint_id} is not claimed by {self.config.identity}")
        if params.get("failed"):
            self.artifacts.release(checkpoint_id)
            return {"action": "released", "checkpoint_id": checkpoint_id}
        try:
            manifest = self.artifacts.manifest(checkpoint_id)
        except ArtifactError as exc:
            raise OperationError(str(exc)) from None
        workload = dict(manifest["workload"])
        pid = int(params["pid"])
        workload.update(pid=pid, state="running", restored_from=checkpoint_id, restored_at=utcnow(), in_job=True)
        self.workloads.put(workload)
        self.artifacts.mark_restored(checkpoint_id, {"by": self.config.identity, "at": utcnow(), "pid": pid})
        return {"action": "adopted", "workload_id": workload["id"], "pid": pid, "checkpoint_id": checkpoint_id}

    def _register(self, params: dict[str, Any]) -> dict[str, Any]:
        workload_id = str(params["workload_id"])
        exchange = self.config.state_dir / "exchange" / workload_id
        exchange.mkdir(parents=True, exist_ok=True)
        workload = {
            "id": workload_id, "kind": "process", "scheduler_id": str(params.get("scheduler_id") or workload_id),
            "name": str(params.get("name") or workload_id), "pid": int(params["pid"]),
            "gpus": int(params.get("gpus") or 0), "started_at": utcnow(),
            "checkpoint_engine": str(params.get("checkpoint_engine") or "criu"),
            "checkpoint_signal": str(params.get("checkpoint_signal") or "SIGUSR1"),
            "engine": str(params.get("engine") or ""), "engine_version": str(params.get("engine_version") or ""),
            "model_name": str(params.get("model_name") or ""), "model_version": str(params.get("model_version") or ""),
            "command": list(params.get("command") or []), "cwd": str(params.get("cwd") or ""),
            # Never keep secrets (the node key is in gpusweep-run's environment): they would reach the artifact store.
            "env": {k: str(v) for k, v in dict(params.get("env") or {}).items()
                    if not any(word in k.upper() for word in SECRET_WORDS)},
            "checkpoint_dir": str(exchange), "state": "running",
            # What a requeue does to the job's output files, as gpusweep-run read it (run.output_mode).
            "output": str(params.get("output") or ""),
        }
        self.workloads.put(workload)
        return {"workload_id": workload_id, "checkpoint_dir": str(exchange)}

    def run_share(self, record: dict[str, Any]) -> dict[str, Any]:
        """Let one other node fetch a checkpoint from here (transfer.py); the token is in the result only."""
        checkpoint_id = str(record["params"]["checkpoint_id"])
        try:
            self.artifacts.verify(checkpoint_id)
        except ArtifactError as exc:
            raise OperationError(str(exc)) from None
        return self.shares.grant(checkpoint_id, str(record["params"]["to"]))

    def run_fetch(self, record: dict[str, Any]) -> dict[str, Any]:
        """Copy a checkpoint from the agent that holds it into this node's store, checked (transfer.py)."""
        params = record["params"]
        checkpoint_id = str(params["checkpoint_id"])
        try:
            manifest = transfer.fetch(self.artifacts, checkpoint_id, str(params["source"]), str(params["token"]),
                                      str(params["sha256"]))
        except (transfer.TransferError, ArtifactError) as exc:
            raise OperationError(str(exc)) from None
        if is_lazy(manifest):
            # Where the receiver reports on the stream (two-phase release); kept apart from the status
            # GET /v1/checkpoints/<id> shows, since the token is the source's secret for this checkpoint.
            write_json_atomic(self.config.state_dir / "lazy-peers" / f"{checkpoint_id}.json",
                              {"source": str(params["source"]), "token": str(params["token"])})
        return {"checkpoint_id": checkpoint_id, "files": len(manifest.get("files", [])),
                "total_bytes": manifest.get("total_bytes", 0)}

    def run_patch(self, record: dict[str, Any]) -> dict[str, Any]:
        params = record["params"]
        component, version = str(params["component"]), str(params["version"])
        # Exact distribution packages (name -> version) where the patch names them: a packaged driver's
        # binaries, or other packages an advisory fixes (component "packages", in place at once).
        wanted = {str(k): str(v) for k, v in (params.get("packages") or {}).items()}
        try:
            method = get_patch_method(str(params["method"]), self.config)
            command = method.command(component, version, wanted or None)
        except PatchError as exc:
            raise OperationError(str(exc)) from None
        in_place = component == OS_PACKAGES
        before = self.facts(fresh=True).get("components", {}).get(component, "")
        base = {"before": before, "method": method.name, "command": command, "dry_run": bool(params.get("dry_run"))}
        if params.get("dry_run"):
            return {**base, "after": before, "output": f"dry run: would run {command or 'nothing'}"}
        if method.name == "noop":
            return {**base, "after": before, "output": f"noop: {component} is managed outside this node's agent"}
        if not method.at_reboot:  # a livepatch: nothing to reinstall, and it never waits for a reboot
            return {**base, **self._livepatch(method, component, version)}
        previous = self._record_previous(record, component, before, method.simulate, wanted)
        base["previous"] = {"version": previous["version_before"], "packages": previous["packages"]}
        if method.simulate:
            if not in_place:
                pending_path = self.config.state_dir / "pending_facts.json"
                pending = read_json(pending_path, {}) or {}
                write_json_atomic(pending_path, {**pending, component: version})
            named = {"packages": wanted} if wanted else {}
            return {**base, "after": version, "reboot_required": not in_place, **named,
                    "output": f"simulated: would run {command}; {component} {version} takes effect "
                              f"{'at once' if in_place else 'at reboot'}"}
        try:
            output = method.apply(component, version, wanted or None)
        except PatchError as exc:
            self._facts = None  # a failed install may have changed some packages: read them again
            raise OperationError(str(exc), base) from None
        installed = self._installed_now(wanted, base)
        after = version if in_place else self.facts(fresh=True).get("components", {}).get(component, "")
        return {**base, "after": after, "output": output, **({"packages": installed} if installed else {}),
                "reboot_required": component in ("driver", "kernel")}

    def _installed_now(self, wanted: dict[str, str], base: dict[str, Any]) -> dict[str, str]:
        """The versions the package manager reports now of the packages a patch named: exactly the
        ones asked for, or the patch failed (a command that exits 0 without installing them)."""
        self._facts = None
        if not wanted:
            return {}
        try:
            manager = get_package_manager(self.config)
            installed = manager.installed() if manager else {}
        except PackageError as exc:
            raise OperationError(f"the installed packages cannot be read after the patch: {exc}", base) from None
        found = {name: installed.get(name, "") for name in wanted}
        wrong = {n: {"want": v, "got": found[n]} for n, v in wanted.items() if found[n] != v}
        if manager is not None and wrong:
            raise OperationError(f"the package manager reports other versions than the patch asked for: {wrong}",
                                 {**base, "packages": found}) from None
        return found if manager is not None else dict(wanted)

    def _livepatch(self, method: PatchMethod, component: str, version: str) -> dict[str, Any]:
        """Apply a patch that takes effect at once; `after` is the version the node reports now."""
        if method.simulate:
            if self.config.static_facts:  # a test or demo node: its facts file says what runs
                path = Path(self.config.static_facts)
                data = read_json(path, {}) or {}
                write_json_atomic(path, {**data, "components": {**data.get("components", {}), component: version}})
            self._facts = None
            return {"after": version, "reboot_required": False,
                    "output": f"simulated: would run {method.command(component, version)}; {component} {version} "
                              "applies at once"}
        try:
            output = method.apply(component, version)
        except PatchError as exc:
            raise OperationError(str(exc)) from None
        finally:
            self._facts = None
        after = self.facts(fresh=True).get("components", {}).get(component, "")
        return {"after": after, "output": output, "reboot_required": False}

    # ----- rollback -----

    def _rollback_records(self) -> dict[str, dict[str, Any]]:
        return dict(read_json(self.config.state_dir / "rollback.json", {}) or {})

    def _record_previous(self, record: dict[str, Any], component: str, before: str, simulated: bool,
                         named: dict[str, str] | None = None) -> dict[str, Any]:
        """What a rollback puts back: the component's version and its exact installed packages, read
        before anything changes. A retry of the same owner's patch keeps the first record (by then
        the packages may be half upgraded)."""
        owner = str(record["params"].get("owner") or record["id"])
        records = self._rollback_records()
        kept = records.get(component)
        if kept and kept.get("owner") == owner:
            return kept
        try:
            manager = get_package_manager(self.config)
            packages = manager.matching(patterns_for(self.config, component)) if manager else {}
            if manager and named:  # the exact packages the patch names: their versions now come back too
                installed = manager.installed()
                packages.update({n: installed[n] for n in named if n in installed})
        except PackageError as exc:
            raise OperationError(f"refusing to patch {component}: its installed packages cannot be recorded "
                                 f"for a rollback ({exc})") from None
        entry = {"owner": owner, "operation_id": record["id"], "component": component, "version_before": before,
                 "packages": packages, "package_manager": manager.name if manager else "", "simulated": simulated,
                 "recorded_at": utcnow()}
        write_json_atomic(self.config.state_dir / "rollback.json", {**records, component: entry})
        return entry

    def run_rollback(self, record: dict[str, Any]) -> dict[str, Any]:
        """Reinstall what the owner's patches recorded; the versions come back at the next reboot."""
        owner = str(record["params"].get("owner") or "")
        chosen = {c: r for c, r in self._rollback_records().items() if not owner or r.get("owner") == owner}
        if not chosen:
            raise OperationError(f"nothing recorded to roll back{' for ' + owner if owner else ''} on "
                                 f"{self.config.identity}")
        reinstalled: dict[str, str] = {}
        outputs = []
        wanted = {n: v for r in chosen.values() for n, v in (r.get("packages") or {}).items()}
        if wanted:
            try:
                manager = get_package_manager(self.config)
                if manager is None:
                    raise PackageError("no package manager on this node")
                outputs.append(manager.install(wanted))
            except PackageError as exc:
                raise OperationError(f"rollback: reinstalling {wanted} failed: {exc}",
                                     {"packages": wanted}) from None
            reinstalled = wanted
            self._facts = None
        # A simulated node's versions live in its static facts: they come back at the (simulated) reboot.
        static = read_json(Path(self.config.static_facts), {}) if self.config.static_facts else {}
        pinned = set((static or {}).get("components") or {})
        pending_path = self.config.state_dir / "pending_facts.json"
        back = {c: str(r.get("version_before") or "") for c, r in chosen.items()}
        simulated = {c: v for c, v in back.items() if v and (c in pinned or chosen[c].get("simulated"))}
        if simulated:
            write_json_atomic(pending_path, {**(read_json(pending_path, {}) or {}), **simulated})
        return {"components": back, "reinstalled": reinstalled, "reboot_required": True,
                "output": "\n".join(outputs) or "no packages recorded; versions restored at reboot"}

    # ----- health gates -----

    def run_health_check(self, record: dict[str, Any]) -> dict[str, Any]:
        """Run the configured checks; the operation succeeds either way and says whether they passed."""
        request = health_request(record["params"])
        return {**run_checks(self.config, request, self.facts(fresh=True)), "node": self.config.identity}

    def run_reboot(self, record: dict[str, Any]) -> dict[str, Any]:
        command = self.config.reboot_command
        if not command:
            raise OperationError("reboot is not configured on this node (set reboot_command, or 'simulate')")
        # A reboot would end the copy the two-phase release may still resume (and CRIU's page server):
        # wait for the moves to settle (a campaign reboots the source right after its moves), bounded.
        unsettled = self.unsettled_lazy_sources()
        if unsettled:
            self.operations.update(record["id"], progress={"waiting_for_lazy_moves": unsettled})
        deadline = time.monotonic() + 4 * self.config.lazy_release_timeout_s
        while unsettled and time.monotonic() < deadline:
            time.sleep(0.5)
            unsettled = self.unsettled_lazy_sources()
        if unsettled:
            raise OperationError(f"lazy moves from this node are not settled yet ({', '.join(unsettled)}): their "
                                 "workloads' copies here may still be resumed; reboot once GET /v1/checkpoints/<id> "
                                 "says lazy.source.state complete or failed (waited "
                                 f"{4 * self.config.lazy_release_timeout_s:.0f} s)")
        boot_id = current_boot_id()
        self.operations.update(record["id"], progress={"boot_id": boot_id, "simulated": command == "simulate"})
        if command == "simulate":
            self.apply_pending_facts()
            if self.config.simulated_reboot_hook:
                subprocess.Popen(shlex.split(self.config.simulated_reboot_hook), start_new_session=True,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.restart_requested.set()
            # The record stays "running"; the restarted agent finishes it (recover()).
            raise OperationDeferred()
        proc = subprocess.run(host_argv(self.config, shlex.split(command)), capture_output=True, text=True,
                              timeout=300, check=False)
        if proc.returncode != 0:
            raise OperationError(f"reboot command {command!r} exited {proc.returncode}: {proc.stderr[-1000:]}")
        raise OperationDeferred()

    def apply_pending_facts(self) -> None:
        """Simulated reboot: patched versions become the static facts file's components."""
        pending_path = self.config.state_dir / "pending_facts.json"
        pending = read_json(pending_path, {}) or {}
        if pending and self.config.static_facts:
            path = Path(self.config.static_facts)
            data = read_json(path, {}) or {}
            data["components"] = {**data.get("components", {}), **pending}
            write_json_atomic(path, data)
        pending_path.unlink(missing_ok=True)

    # ----- after a restart -----

    def recover(self) -> None:
        """Finish or fail the operations a previous agent process left unfinished."""
        self._recover_lazy()
        for record in self.operations.all():
            if record.get("state") not in ("pending", "running"):
                continue
            kind = record.get("kind")
            if kind == "checkpoint":
                threading.Thread(target=self._recover_checkpoint, args=(record,), daemon=True).start()
            elif kind == "reboot":
                progress = record.get("progress", {})
                if progress.get("simulated") or progress.get("boot_id") != current_boot_id():
                    facts = self.facts(fresh=True)
                    self.operations.update(record["id"], state="succeeded", finished_at=utcnow(),
                                           result={"simulated": bool(progress.get("simulated")),
                                                   "components": facts.get("components", {})})
                else:
                    self.operations.update(record["id"], state="failed", finished_at=utcnow(),
                                           error="the agent restarted but the node did not reboot")
            elif kind == "restore":
                threading.Thread(target=self._recover_restore, args=(record,), daemon=True).start()
            else:
                self.operations.update(record["id"], state="failed", finished_at=utcnow(),
                                       error="interrupted by an agent restart; nothing is rerun (use a new id)")

    def unsettled_lazy_sources(self) -> list[str]:
        """Checkpoints whose lazy move from this node has no decision acted on yet."""
        found = []
        for path in sorted((self.config.state_dir / "lazy").glob("*.json")):
            source = (read_json(path, None) or {}).get("source") or {}
            if source.get("state") in ("serving", "awaiting_receiver") or (
                    source.get("decision") and not source.get("applied")):
                found.append(path.stem)
        return found

    def _recover_lazy(self) -> None:
        """Take up the lazy moves a previous agent process left unsettled (the two-phase release): the
        source's copy is never left stopped without a decision, the receiver's never runs on unreleased."""
        unsettled = set(self.unsettled_lazy_sources())
        for path in sorted((self.config.state_dir / "lazy").glob("*.json")):
            status = read_json(path, None)
            if not isinstance(status, dict):
                continue
            source, receiver = status.get("source") or {}, status.get("receiver") or {}
            if path.stem in unsettled:
                threading.Thread(target=self._recover_lazy_source, args=(path.stem, source), daemon=True).start()
            if receiver.get("state") in ("streaming", "releasing", "failing"):
                threading.Thread(target=self._recover_lazy_receiver, args=(path.stem, receiver), daemon=True).start()

    def _recover_lazy_source(self, checkpoint_id: str, source: dict[str, Any]) -> None:
        if source.get("decision"):
            self._settle_lazy_source(checkpoint_id)  # applies the decision taken before the restart
            return
        self._write_lazy(checkpoint_id, "source", {"recovered": True})
        # Word from the receiver counts from now: it may have reported while no agent listened.
        with self._lazy_lock:
            self._lazy_heard[checkpoint_id] = time.monotonic()
        started = time.monotonic()
        if source.get("state") == "serving":
            # CRIU's dump runs on in its own session: wait for its page server to end, read the outcome.
            dump_pid = int(source.get("dump_pid") or 0)
            while lazy.same_process(dump_pid, str(source.get("dump_started") or "")):
                self._read_lazy_mailbox(checkpoint_id)
                reap(dump_pid)
                time.sleep(0.05)
            ended = lazy.ended_by_log(Path(str(source.get("log") or "")), started)
            pid = int(source.get("pid") or 0)
            if ended["state"] == "complete" and not lazy.same_process(pid, str(source.get("pid_started") or "")):
                ended = {**ended, "state": "failed", "error": "the frozen copy is gone"}
            self._lazy_source_ended(checkpoint_id, ended)
        else:
            self._lazy_source_ended(checkpoint_id, {**(source.get("page_server") or {}), "state": "complete"})

    def _recover_lazy_receiver(self, checkpoint_id: str, receiver: dict[str, Any]) -> None:
        """The userfaultfds the previous agent held are gone: unless every page had arrived, the restored
        copy and the daemon go now, and the source hears so; it keeps its copy only on the source's release."""
        pid = int(receiver.get("pid") or 0)
        if not lazy.same_process(pid, str(receiver.get("pid_started") or "")):
            pid = 0
        daemon_pid = int(receiver.get("daemon_pid") or 0)
        daemon_alive = lazy.same_process(daemon_pid, str(receiver.get("daemon_started") or ""))
        arrived, expected = lazy.transferred(Path(str(receiver.get("log") or "")))
        complete = bool(pid) and not daemon_alive and expected > 0 and arrived == expected
        if daemon_alive:
            lazy.kill_if_alive(daemon_pid)
        status: dict[str, Any] = {"pages_arrived": arrived, "pages_expected": expected, "recovered": True}
        if not complete:
            status["error"] = "the agent restarted before every page had arrived"
        self._settle_lazy_receiver(checkpoint_id, pid, complete, status, time.monotonic())

    def _recover_restore(self, record: dict[str, Any]) -> None:
        """A restore the previous agent process left unfinished: did the workload come back?

        CRIU outlives the agent that started it, so a restore still running on these images is
        waited for. A live restored process means the restore succeeded; otherwise the claim is
        released and the operation fails as interrupted, so the caller may restore again (a new id).
        """
        op_id = record["id"]
        checkpoint_id = str((record.get("params") or {}).get("checkpoint_id", ""))
        try:
            image_dir = self.artifacts.image_dir(checkpoint_id)
            manifest = self.artifacts.manifest(checkpoint_id)
        except ArtifactError as exc:
            self.operations.update(op_id, state="failed", finished_at=utcnow(), error=str(exc))
            return
        deadline = time.monotonic() + 600
        while processes_mentioning(str(image_dir)) and time.monotonic() < deadline:
            time.sleep(0.2)
        pidfile = self.config.state_dir / "restore" / checkpoint_id / "restored.pid"
        pid = int(pidfile.read_text().strip() or 0) if pidfile.is_file() else 0
        ours = self.artifacts.claimed_by(checkpoint_id) == self.config.identity
        if ours and pid and pid_alive(pid) and get_engine(manifest["engine"], self.config).live:
            workload = dict(manifest["workload"])
            workload.update(pid=pid, state="running", restored_from=checkpoint_id, restored_at=utcnow())
            self.workloads.put(workload)
            self.artifacts.mark_restored(checkpoint_id, {"by": self.config.identity, "at": utcnow(), "pid": pid})
            self.operations.update(op_id, state="succeeded", finished_at=utcnow(), result={
                "workload_id": workload["id"], "pid": pid, "checkpoint_id": checkpoint_id, "recovered": True,
                "cold_start": False})
            return
        if ours:
            self.artifacts.release(checkpoint_id)
        self.operations.update(op_id, state="failed", finished_at=utcnow(), result={"interrupted": True},
                               error="interrupted by an agent restart before the restore finished; the checkpoint "
                                     "is free to be restored again (use a new operation id)")

    def _recover_checkpoint(self, record: dict[str, Any]) -> None:
        progress = record.get("progress") or {}
        checkpoint_id, workload = progress.get("checkpoint_id"), progress.get("workload")
        op_id = record["id"]
        if not checkpoint_id or not workload:
            self.operations.update(op_id, state="failed", finished_at=utcnow(),
                                   error="interrupted by an agent restart before the checkpoint began",
                                   result={"workload_state": "running", "interrupted": True})
            return
        try:
            engine = get_engine(progress["engine"], self.config)
            complete = engine.recover(workload, self.artifacts.image_dir(checkpoint_id), progress)
            if complete:
                leave = bool(record["params"].get("leave_running"))
                try:
                    self._make_durable(checkpoint_id, workload)
                except OperationError as exc:  # the images stay, unsealed, as on the usual path
                    self.operations.update(op_id, state="failed", finished_at=utcnow(), error=str(exc),
                                           result=exc.result)
                    return
                result = self._finish_checkpoint(op_id, workload, progress["engine"], checkpoint_id,
                                                 engine.recovered, leave, requires=record["params"].get("requires"))
                self.operations.update(op_id, state="succeeded", finished_at=utcnow(),
                                       result={**result, "recovered": True})
                return
        except Exception as exc:
            log.exception("recovering checkpoint operation %s", op_id)
            error = f"recovery failed: {exc}"
        else:
            error = "interrupted by an agent restart; the image is incomplete and was discarded"
        self.artifacts.discard(checkpoint_id)
        alive = pid_alive(int(workload.get("pid") or 0))
        if self.workloads.get(workload["id"]) is not None:
            self.workloads.update(workload["id"], state="running" if alive else "exited")
        # Nothing lasting came of it: the images are gone and the workload still runs, so the
        # caller may checkpoint it again (under a new operation id).
        self.operations.update(op_id, state="failed", finished_at=utcnow(), error=error,
                               result={"workload_state": "running" if alive else "exited", "interrupted": alive})

    # ----- housekeeping -----

    def reaper(self) -> None:
        """Collect restored processes the agent adopted as subreaper, so their pids free up."""
        while not self._stop.wait(0.5):
            for workload in self.workloads.all().values():
                reap(int(workload.get("pid") or 0))

    def stop(self) -> None:
        self._stop.set()

    def reexec(self) -> None:
        log.info("restarting the agent (simulated reboot)")
        os.execv(sys.executable, [sys.executable, "-m", "gpusweep_agent.main", *self.argv])


def health_request(params: dict[str, Any]) -> HealthRequest:
    """The health gate's parameters, checked (ValueError names the bad one)."""
    expected = params.get("expected") or {}
    if not isinstance(expected, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in expected.items()):
        raise ValueError("health_check: expected must be an object of component -> version")
    level = params.get("dcgm_level") or 0
    if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level <= 4:
        raise ValueError("health_check: dcgm_level must be 0 (none) to 4")
    count = params.get("gpu_count") or 0
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("health_check: gpu_count must be a whole number")
    site = params.get("site_checks")
    if site is not None and not (isinstance(site, list) and all(isinstance(n, str) and n for n in site)):
        raise ValueError("health_check: site_checks must be a list of names (or absent: all configured)")
    return HealthRequest(expected=dict(expected), gpu_count=count, dcgm_level=level, site_checks=site)


def is_lazy(manifest: dict[str, Any]) -> bool:
    """Whether the image's memory is still with its source (a lazy dump: engines/lazy.py)."""
    return bool(((manifest.get("engine_data") or {}).get("dump") or {}).get("mode") == "lazy")


def free_port(address: str) -> int:
    """A port free on `address` now, for CRIU's page server (which takes a number, not a socket)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def current_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def become_subreaper() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        log.info("could not become a child subreaper; restored processes are reparented to init")
