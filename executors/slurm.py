"""The `slurm` back end: a node is a Slurm node, a workload is a batch job (`slurm-<jobid>`); a job
without GPU gres that its node's agent finds holding GPUs counts those GPUs as its own
(``executors.base.as_gpu_workload``); a process the agent finds holding a GPU in no job (``gpu-pid-<pid>``)
is checkpointed, stopped and restored by the agents themselves (``LocalExecutor``'s operations; checkpointable
only with ``shared_checkpoint_dir``, where the receiving agent reads the images).

It drives Slurm through the inventory's ``SlurmClient`` (``scontrol``; ``sinfo --json`` and
``squeue --json`` to read; a pyslurm client returning the same dictionaries fits behind it), and
the node agent (``LocalExecutor``) for what only the node can do: checkpoint a process, install
packages, reboot.

Everything gpusweep does is written where Slurm shows it, so a retry reads what the first attempt
did and undo removes only gpusweep's own marks:

- drain: ``scontrol update nodename=N state=DRAIN reason="gpusweep: campaign C op O"``. A node
  drained, down or in a maintenance reservation for someone else is left as it is: it takes no
  work anyway, ``maintenance_hold`` reports it, and it is never resumed by gpusweep. Undo and
  return to service resume a node only while its reason is gpusweep's.
- checkpoint of a job whose payload runs under ``gpusweep-run`` (its agent workload id is
  ``slurm-<jobid>``): the node agent checkpoints the payload (criu, cuda or signal) while
  ``gpusweep-run`` keeps the job alive; the job's admin comment gets the record
  (``gpusweep:<base64 JSON>``: operation, checkpoint id, engine, the image's portability
  requirements) and the job is held and requeued (``scontrol requeuehold``). Multi-node jobs are
  not checkpointed (the agent sees one node): they follow the campaign's policy.
- restore on a target: the held job is constrained to nodes where its checkpoint is valid (the
  target in its node list, nodes that publish incompatible versions as features excluded, and the
  required version features added to its constraint where the target publishes them), the record
  notes the restore's operation, and the job is released; when Slurm starts it again its
  ``gpusweep-run`` restores the checkpoint inside the job. The call returns once the job runs on
  the target and the target's agent reports the checkpoint restored there. The job id is kept.
  A restore under another operation id is refused: a checkpoint is restored once.
- the job's output: Slurm 22.05 truncates a requeued job's output files unless it runs with
  ``--open-mode=append`` or ``JobFileAppend=1``; its ``gpusweep-run`` then keeps them (a copy taken at
  the checkpoint, put back in the requeued job) and the checkpoint's manifest says which
  (``OUTPUT_MODES``, from the mode the wrapper registered and ``scontrol show config``).
- the node's own unwind: ``undo`` leaves the drain while jobs checkpointed there by the campaign wait to
  come home; a restore there swaps the drain for a reservation of that node for the job's user
  (``gpusweep-c<C>-home-<node>``, the job joins it), so only that job starts; the engine's undo after
  the restores resumes the node and deletes it. A restore there that fails drains the node again.
- no node takes the checkpoint: ``release_held`` gives the held job back to Slurm with its own
  constraints and admin comment (the record goes), released; never left requeued held. A record of a
  move whose job runs again (released by hand) blocks no later checkpoint.
- stop (cold restart): ``scontrol requeue``; Slurm starts the job again from its first line. Where the
  requeue would truncate the output files of a job under ``gpusweep-run``, the node's agent first stops
  the payload (a checkpoint of engine none), so the wrapper keeps them as after a move; ``stop`` returns
  which (``OUTPUT_MODES``). Its record (with the job's own admin comment and the run it stopped, so a
  retry requeues once) goes when the node's sweep ends (return to service or undo).
- patch through the agent; reboot through the agent (default) or through Slurm
  (``connection["reboot_via"] = "slurm"``: ``scontrol reboot ASAP nextstate=RESUME``, the site's
  RebootProgram reboots); either way the call returns once slurmd has registered again (its start
  time is after the reboot was asked for, recorded in the drain reason so a retry waits for the
  same reboot). verify reads the agent's facts and Slurm's features; where the site publishes
  versions as features (``component_features``) gpusweep rewrites those features to what the
  agent reports.
- maintenance reservations just in time, instead of one reservation set weeks ahead
  (``executor_options["maintenance_reservation"]``): "wave" (``wave_reservation``, ``reserve_wave``,
  ``release_wave``, driven by the engine): when a wave is admitted, ``scontrol create reservation
  gpusweep-c<C>-w<W> nodes=<the wave's nodes on this cluster> starttime=now duration=<the plan's
  time for the wave, plus a margin> flags=maint,ignore_jobs``; a node back in service leaves it
  (``scontrol update reservation nodes=...``; the last one deletes it), and the engine deletes what
  is left (nodes that failed and stay out) when the wave's last sweep ends or the campaign is
  aborted. "node" (or the older ``connection["maintenance_reservations"]``): the drain creates
  ``gpusweep-c<C>-s<sweep>`` for that node alone (``reservation_minutes``, 120), deleted by return to
  service and undo. Both are made for ``connection["reservation_users"]`` (root unless the site names its
  own admin account). Only reservations named gpusweep- are ever deleted, and gpusweep's own
  reservations never count as someone else's maintenance hold.

Checkpoint images: with ``connection["shared_checkpoint_dir"]`` set (the folder every node's agent
uses as ``artifact_dir``, a site's parallel file system) the target reads them there; without it,
the restore first has the source's agent share the checkpoint with the target (a token for that
checkpoint and receiver) and the target's agent fetch it, every file checked against the
manifest's SHA-256 and the manifest against the digest recorded at the checkpoint
(agent/src/gpusweep_agent/transfer.py).

Settings (``cluster.connection``): the SlurmClient's (``slurm_conf``, ``bin_dir``, ``timeout_s``,
``component_features``), ``shared_checkpoint_dir``, ``agents`` (false: no agent on the nodes),
``agent_endpoints`` (node -> URL, when the inventory has none), ``reboot_via`` (agent | slurm). ``executor_options``:
``restore_wait_s`` (60), ``reboot_wait_s`` (120), ``poll_s`` (0.5), and LocalExecutor's agent
options.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import replace
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from executors import portability
from executors.base import (
    CheckpointResult,
    Executor,
    ExecutorError,
    GpuUser,
    HealthGates,
    HealthResult,
    InterruptedOperation,
    NodeRef,
    PatchResult,
    PermanentExecutorError,
    RestoreResult,
    RollbackResult,
    TemporaryExecutorError,
    VerifyResult,
    WorkloadInfo,
    as_gpu_workload,
    held_gpus,
    is_bare_process,
    owned_by,
)
from executors.local import LocalExecutor, bare_processes
from inventory.sources.slurm import (
    DEFAULT_COMPONENT_FEATURES,
    CliSlurmClient,
    SlurmClient,
    SlurmError,
    expand_hostlist,
    node_from_slurm,
    workload_from_slurm,
)

MARK = "gpusweep:"  # how every reason and admin comment of gpusweep's begins
RESERVATION_PREFIX = "gpusweep-"
AGENT_OPTIONS = ("secret", "request_timeout", "operation_timeout", "patch_method")
REBOOT_VIA = ("agent", "slurm")
RESERVATION_KINDS = ("", "node", "wave")  # executor_options.maintenance_reservation
# What a requeue does to a job's output files, by what its gpusweep-run registered (agent run.output_mode).
OUTPUT_MODES = {
    "append": "appended by Slurm: the job runs with --open-mode=append or the site's JobFileAppend=1",
    "kept": "kept by gpusweep-run: Slurm truncates the job's output files at a requeue (--open-mode=truncate, "
            "or the site's JobFileAppend=0); the wrapper copied them before the requeue and put them back "
            "in the requeued job",
    "": "not kept: the job has no output file, or its payload does not run under gpusweep-run",
}
ENDED = ("CANCELLED", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL")  # a job in none of them may run again
HELD_STATES = ("down", "fail", "failing", "not_responding", "maintenance", "reboot_requested", "reboot_issued",
               "power_down", "powered_down", "powering_down")


def campaign_of(operation_id: str) -> str:
    match = re.match(r"^gs-(\d+)-", operation_id)
    return match.group(1) if match else "?"


def job_of(workload_id: str) -> str:
    job = workload_id.removeprefix("slurm-")
    if not job.isdigit():
        raise PermanentExecutorError(f"{workload_id!r} is not a Slurm job (slurm-<jobid>)")
    return job


def _state_words(node: dict[str, Any]) -> set[str]:
    raw = node.get("state", "")
    states = raw if isinstance(raw, list) else [raw]
    return {str(s).lower() for s in [*states, *node.get("state_flags", [])]}


def _job_state(job: dict[str, Any]) -> str:
    state = job.get("job_state", "")
    return str(state[0] if isinstance(state, list) and state else state).upper()


def _nodes(job: dict[str, Any]) -> list[str]:
    """The nodes a job holds (none when it is not running)."""
    observed = workload_from_slurm(job)
    return observed.nodes if observed is not None else []


def _held(job: dict[str, Any]) -> bool:
    return _job_state(job) == "PENDING" and (int(job.get("priority") or 0) == 0 or str(
        job.get("state_reason") or "").startswith("JobHeld"))


def _constraints_of(job: dict[str, Any]) -> dict[str, str]:
    """Where the job asked to run, before gpusweep constrained it to a target (put back by a release)."""
    return {"nodelist": str(job.get("required_nodes") or ""), "excnodelist": str(job.get("excluded_nodes") or ""),
            "features": str(job.get("features") or ""),
            "reservation": str(job.get("reservation") or job.get("resv_name") or "")}


def read_record(job: dict[str, Any]) -> dict[str, Any]:
    """gpusweep's record in a job's admin comment ({} when there is none, or it is someone else's)."""
    text = str(job.get("admin_comment") or "")
    if not text.startswith(MARK):
        return {}
    try:
        value = json.loads(base64.urlsafe_b64decode(text[len(MARK):].encode()))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def write_record(record: dict[str, Any]) -> str:
    # base64: scontrol splits its arguments on spaces and strips quotes.
    return MARK + base64.urlsafe_b64encode(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).decode()


class SlurmExecutor(Executor):
    name = "slurm"
    restarts_cold_starts = "Slurm (the job is requeued and runs again from its first line)"

    def __init__(self, cluster: Any = None, client: SlurmClient | None = None, **options: Any) -> None:
        super().__init__(cluster, **options)
        self.connection: dict[str, Any] = dict((cluster.connection or {}) if cluster is not None else {})
        self.slurm: SlurmClient = client or CliSlurmClient(self.connection)
        self.agents = LocalExecutor(cluster, **{k: v for k, v in options.items() if k in AGENT_OPTIONS})
        self.reboot_via = str(self.connection.get("reboot_via", "agent"))
        if self.reboot_via not in REBOOT_VIA:
            raise ImproperlyConfigured(f"reboot_via {self.reboot_via!r}: one of {', '.join(REBOOT_VIA)}")
        self.features = dict(self.connection.get("component_features") or DEFAULT_COMPONENT_FEATURES)
        self._known: set[str] | None = None
        self.reservation_kind = str(self.options.get("maintenance_reservation") or "")
        if self.reservation_kind not in RESERVATION_KINDS:
            raise ImproperlyConfigured(f"maintenance_reservation {self.reservation_kind!r}: one of "
                                       f"{', '.join(k for k in RESERVATION_KINDS if k)} (or none)")

    @property
    def reservation_users(self) -> str:
        """Who may run in gpusweep's maintenance reservations (``connection["reservation_users"]``, comma-separated
        Slurm users): the site's own admin account where it runs none as root; root by default."""
        users = self.connection.get("reservation_users") or "root"
        return ",".join(users) if isinstance(users, list) else str(users)

    def option(self, name: str, default: float) -> float:
        return float(self.options.get(name, default))

    def _slurm(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A Slurm call; a controller that does not answer is temporary, a refusal permanent."""
        try:
            return fn(*args, **kwargs)
        except SlurmError as exc:
            text = str(exc)
            temporary = any(w in text.lower() for w in ("timed out", "unable to contact", "connection refused",
                                                        "could not start", "socket timed out"))
            raise (TemporaryExecutorError if temporary else PermanentExecutorError)(f"{what}: {text}") from None

    # -- Slurm's view ------------------------------------------------------------------
    def _node(self, name: str) -> dict[str, Any]:
        for node in self._slurm("sinfo", self.slurm.nodes):
            if node.get("name") == name:
                return dict(node)
        raise PermanentExecutorError(f"no node {name!r} in Slurm")

    def _job(self, job_id: str) -> dict[str, Any] | None:
        return next((dict(j) for j in self._slurm("squeue", self.slurm.jobs) if str(j.get("job_id")) == job_id), None)

    def _agent(self, node: NodeRef) -> NodeRef | None:
        if self.connection.get("agents") is False:
            return None
        endpoint = node.endpoint or str((self.connection.get("agent_endpoints") or {}).get(node.name, ""))
        return replace(node, endpoint=endpoint) if endpoint else None

    def _need_agent(self, node: NodeRef) -> NodeRef:
        ref = self._agent(node)
        if ref is None:
            raise PermanentExecutorError(f"node {node.identity} has no gpusweep agent endpoint")
        return ref

    def _published(self, node: dict[str, Any]) -> dict[str, str]:
        """The versions the node publishes as features, and its kernel as slurmd reports it."""
        return dict(node_from_slurm(node, self.features).components)

    # -- planning ----------------------------------------------------------------------
    def reachable(self, node: NodeRef) -> str:
        # The planner asks for every node in scope: one sinfo per executor serves them all.
        try:
            if self._known is None:
                self._known = {str(n.get("name")) for n in self._slurm("sinfo", self.slurm.nodes)}
        except (PermanentExecutorError, TemporaryExecutorError) as exc:
            return str(exc)
        if node.name not in self._known:
            return f"no node {node.name!r} in Slurm"
        if self.connection.get("agents") is not False:
            ref = self._agent(node)
            if ref is None:
                return "no agent endpoint: the node's agent has never sent a heartbeat and none is configured"
            return self.agents.reachable(ref)
        return ""

    def maintenance_hold(self, node: NodeRef) -> str:
        info = self._node(node.name)
        words = _state_words(info)
        reason = str(info.get("reason") or "")
        ours = reason.startswith(MARK)
        by = str(info.get("reason_set_by_user") or "")
        said = f": {reason}" if reason else ""
        if words & {"drain", "drained", "draining"} and not ours:
            return f"Slurm: drained by {by or 'someone other than gpusweep'}{said}"
        held = sorted(words & set(HELD_STATES))
        if "maintenance" in held and not ours:
            # A MAINT reservation shows as the node's state: ours (gpusweep-...) holds nothing back.
            mine = self._reservations_of(node.name)
            if mine and all(r.get("ReservationName", "").startswith(RESERVATION_PREFIX) for r in mine):
                held.remove("maintenance")
        if held and not ours:
            return f"Slurm: node is {'+'.join(held)}{said}"
        for reservation in self._reservations_of(node.name):
            if not reservation.get("ReservationName", "").startswith(RESERVATION_PREFIX):
                return (f"Slurm: in maintenance reservation {reservation.get('ReservationName')} "
                        f"({reservation.get('StartTime')} to {reservation.get('EndTime')})")
        return ""

    def _reservations_of(self, name: str, active_only: bool = True) -> list[dict[str, str]]:
        found = []
        for reservation in self._slurm("scontrol show reservation", self.slurm.reservations):
            flags = {f.strip().upper() for f in reservation.get("Flags", "").split(",")}
            if "MAINT" not in flags or name not in expand_hostlist(reservation.get("Nodes", "")):
                continue
            if active_only and reservation.get("State", "").upper() != "ACTIVE":
                continue
            found.append(reservation)
        return found

    # -- reads -------------------------------------------------------------------------
    def facts(self, node: NodeRef) -> dict[str, str]:
        published = self._published(self._node(node.name))
        ref = self._agent(node)
        return {**published, **(self.agents.facts(ref) if ref is not None else {})}

    def _portability_facts(self, node: NodeRef) -> dict[str, str]:
        info = self._node(node.name)
        model = node_from_slurm(info, self.features).gpu_model or node.gpu_model
        ref = self._agent(node)
        agent = self.agents.client(ref).get("/v1/facts") if ref is not None else {}
        versions = {**self._published(info), **{str(k): str(v) for k, v in (agent.get("components") or {}).items()}}
        return portability.node_facts(str(agent.get("gpu_model") or model), versions)

    def _running_here(self, node: NodeRef) -> list[dict[str, Any]]:
        jobs = [j for j in self._slurm("squeue", self.slurm.jobs) if _job_state(j) == "RUNNING"]
        return [j for j in jobs if node.name in _nodes(j)]

    def gpu_users(self, node: NodeRef) -> list[GpuUser]:
        """The agent's GPU users, each of a job running here with that job (its cgroup shows the job id, or its
        gpusweep-run registered slurm-<jobid>) as the workload acted on."""
        ref = self._agent(node)
        if ref is None:
            return []
        jobs = [o for o in (workload_from_slurm(j) for j in self._running_here(node)) if o is not None]
        found = []
        for user in self.agents.gpu_users(ref):
            job = next((o for o in jobs if owned_by(user, "slurm_job", o.scheduler_id, f"slurm-{o.scheduler_id}")),
                       None)
            if job is not None:
                user = replace(user, owner_kind="slurm_job", owner_id=job.scheduler_id,
                               workload_ref=f"slurm-{job.scheduler_id}", workload_name=job.name)
            found.append(user)
        return found

    def _bare_processes(self, listed: list[dict[str, Any]]) -> list[WorkloadInfo]:
        """The bare GPU processes (in no job) among the agent's workloads `listed`. Their checkpoint is restored
        elsewhere by the target's agent from the checkpoint folder the nodes share; without one (no job's
        record to fetch it by) they are not checkpointable: stopped or waited for by policy."""
        found = bare_processes(listed)
        return found if self.connection.get("shared_checkpoint_dir") else [
            replace(w, checkpoint_engine="none") for w in found]

    def list_workloads(self, node: NodeRef) -> list[WorkloadInfo]:
        here = self._running_here(node)
        ref = self._agent(node)
        listed = self.agents.client(ref).get("/v1/workloads").get("workloads", []) if ref is not None else []
        bare = self._bare_processes(listed)
        if not here:
            return bare
        registered = {str(w.get("id")): w for w in listed}
        # A job that declared no GPU gres may hold GPUs all the same: the agent sees it (by cgroup, or by its
        # gpusweep-run registration), and it is then the node's GPU workload like a declared one.
        users = self.agents.gpu_users(ref) if ref is not None and any(
            not getattr(workload_from_slurm(j), "gpus", 0) for j in here) else []
        found = []
        for job in here:
            observed = workload_from_slurm(job)
            assert observed is not None
            workload_id = f"slurm-{observed.scheduler_id}"
            agent = registered.get(workload_id, {})
            if agent.get("state") not in (None, "running", "restored"):
                continue  # checkpointed: its job is being requeued
            single = len(observed.nodes) <= 1
            steps = agent.get("steps")
            info = WorkloadInfo(
                id=workload_id, name=observed.name, gpus=observed.gpus,
                checkpoint_engine=str(agent.get("checkpoint_engine") or "none") if single else "none",
                state=observed.state, steps=int(steps) if steps is not None else None,
                fingerprint={k: str(agent.get(k, "")) for k in ("engine", "engine_version", "model_name",
                                                               "model_version")})
            # A job without GPUs is still the node's workload (the reboot ends it too): Slurm's rule.
            found.append(as_gpu_workload(info, users, "slurm_job", observed.scheduler_id, workload_id) or info)
        return found + bare

    # -- drain, return, undo -----------------------------------------------------------
    def drain(self, node: NodeRef, operation_id: str) -> None:
        info = self._node(node.name)
        reason = str(info.get("reason") or "")
        ours = reason.startswith(MARK) and bool(_state_words(info) & {"drain", "drained", "draining", "down"})
        if not ours and self.maintenance_hold(node):
            return  # out of service for someone else: takes no work, and their reason stays theirs
        if self.connection.get("maintenance_reservations") or self.reservation_kind == "node":
            # Just in time: this node, from now for the sweep's time, instead of one reservation weeks ahead.
            self.reserve(self._sweep_reservation(operation_id), [node.name], "now",
                         int(self.connection.get("reservation_minutes", 120)))
        if ours:
            return  # drained by gpusweep already (this campaign's, or another's, whose reason stays)
        self._slurm(f"drain {node.name}", self.slurm.update_node, node.name, state="DRAIN",
                    reason=f"{MARK} campaign {campaign_of(operation_id)} op {operation_id}")

    def _resume(self, node: NodeRef, operation_id: str) -> None:
        info = self._node(node.name)
        reason = str(info.get("reason") or "")
        if not reason.startswith(MARK) or f"campaign {campaign_of(operation_id)} " not in reason:
            return  # not drained, or drained by someone else (or another campaign): theirs to lift
        if not _state_words(info) & {"drain", "drained", "draining", "down"}:
            return
        self._slurm(f"resume {node.name}", self.slurm.update_node, node.name, state="RESUME")
        # Slurm marks a resumed node not responding until its next ping: done once it takes work again.
        until = time.monotonic() + self.option("resume_wait_s", 30)
        while _state_words(self._node(node.name)) & {"not_responding", "down"}:
            if time.monotonic() > until:
                raise TemporaryExecutorError(f"node {node.name} was resumed but slurmd does not answer")
            time.sleep(self.option("poll_s", 0.5))

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        self._resume(node, operation_id)
        self._unreserve(node, operation_id)
        self._leave_wave(node, operation_id)
        self._end_stops(node, operation_id)

    def undo(self, node: NodeRef, operation_id: str) -> None:
        """Give the node back, except while jobs checkpointed on it by this campaign wait to come home: it
        stays drained and each restore there admits its job alone (``_admit_home``); the engine's undo
        after those restores (same operation id) resumes it, so it takes other work only once they run."""
        if not self._coming_home(node, operation_id):
            self._resume(node, operation_id)
            self._end_home(node, operation_id)
        self._unreserve(node, operation_id)
        self._leave_wave(node, operation_id)
        self._end_stops(node, operation_id)

    def _end_stops(self, node: NodeRef, operation_id: str) -> None:
        """The node's sweep is over: the cold-restart records this campaign wrote on the jobs it requeued from
        `node` go (a retried stop needed them until now), and each job gets its own admin comment back."""
        campaign = campaign_of(operation_id)
        for job in self._slurm("squeue", self.slurm.jobs):
            record = read_record(job)
            if (record.get("stop_op") and not record.get("ck_op") and record.get("node") == node.name
                    and campaign_of(str(record["stop_op"])) == campaign):
                job_id = str(job.get("job_id"))
                self._slurm(f"clear cold restart record on job {job_id}", self.slurm.update_job, job_id,
                            admincomment=str(record.get("prior") or ""))

    def _coming_home(self, node: NodeRef, operation_id: str) -> list[str]:
        """Jobs this campaign checkpointed on `node` that wait, pending, for a restore."""
        campaign = campaign_of(operation_id)
        found = []
        for job in self._slurm("squeue", self.slurm.jobs):
            record = read_record(job)
            if (record.get("node") == node.name and record.get("ck_op") and not record.get("restore_op")
                    and campaign_of(str(record["ck_op"])) == campaign and _job_state(job) not in ENDED):
                found.append(str(job.get("job_id")))
        return found

    @staticmethod
    def _home_reservation(node: NodeRef, operation_id: str) -> str:
        return f"{RESERVATION_PREFIX}c{campaign_of(operation_id)}-home-{node.name}"

    def _admit_home(self, job: dict[str, Any], record: dict[str, Any], target: NodeRef, operation_id: str) -> str:
        """A restore on the job's own node while gpusweep drains it (an unwind): a reservation of that node for
        the job's user, which the job joins, replaces the drain, so the job starts there and no other job does.
        Returns the reservation's name ("" when the node is not drained by this campaign)."""
        info = self._node(target.name)
        reason = str(info.get("reason") or "")
        if (target.name != record.get("node") or not reason.startswith(MARK)
                or f"campaign {campaign_of(operation_id)} " not in reason
                or not _state_words(info) & {"drain", "drained", "draining"}):
            return ""
        name = self._home_reservation(target, operation_id)
        if not any(r.get("ReservationName") == name for r in self._slurm("scontrol show reservation",
                                                                         self.slurm.reservations)):
            minutes = max(1, int(self.option("restore_wait_s", 60) // 60) + 5)
            self._slurm(f"create reservation {name}", self.slurm.create_reservation, name, [target.name], "now",
                        minutes, "maint,ignore_jobs", str(job.get("user_name") or "root"))
        return name

    def _end_home(self, node: NodeRef, operation_id: str) -> None:
        """The node's own jobs are home (or given up): its homecoming reservation ends."""
        name = self._home_reservation(node, operation_id)
        if not any(r.get("ReservationName") == name for r in self._slurm("scontrol show reservation",
                                                                         self.slurm.reservations)):
            return
        # Slurm deletes no reservation a job uses: the jobs leave it first (they run on, it only admitted them).
        for job in self._slurm("squeue", self.slurm.jobs):
            if _constraints_of(job)["reservation"] == name:
                self._slurm(f"job {job.get('job_id')} leaves {name}", self.slurm.update_job, str(job.get("job_id")),
                            reservation="")
        try:
            self._slurm(f"delete reservation {name}", self.slurm.delete_reservation, name)
        except PermanentExecutorError:
            self._slurm(f"end reservation {name}", self.slurm.end_reservation, name)

    def _leave_wave(self, node: NodeRef, operation_id: str) -> None:
        """A node back in service leaves its wave's reservation, so work (a job coming home after a
        kernel patch, a move onto it) may start there while the rest of the wave goes on; the last
        node leaving deletes it (Slurm has no empty reservation). The engine deletes what is left
        (nodes that failed and stay out) when the wave ends."""
        if self.reservation_kind != "wave":
            return
        prefix = f"{RESERVATION_PREFIX}c{campaign_of(operation_id)}-w"
        for reservation in self._slurm("scontrol show reservation", self.slurm.reservations):
            name = str(reservation.get("ReservationName", ""))
            nodes = expand_hostlist(reservation.get("Nodes", ""))
            if not name.startswith(prefix) or node.name not in nodes:
                continue
            try:
                if len(nodes) > 1:
                    self._slurm(f"update reservation {name}", self.slurm.update_reservation, name,
                                [n for n in nodes if n != node.name])
                else:
                    self._slurm(f"delete reservation {name}", self.slurm.delete_reservation, name)
            except PermanentExecutorError:
                # Deleted meanwhile (the wave ended, or an abort): there is nothing to leave.
                if any(r.get("ReservationName") == name for r in self._slurm("scontrol show reservation",
                                                                             self.slurm.reservations)):
                    raise

    @staticmethod
    def _sweep_reservation(operation_id: str) -> str:
        match = re.match(r"^gs-(\d+)-(\d+)-", operation_id)
        return f"{RESERVATION_PREFIX}c{match.group(1)}-s{match.group(2)}" if match else \
            f"{RESERVATION_PREFIX}{re.sub(r'[^A-Za-z0-9_.-]', '_', operation_id)[:60]}"

    def _unreserve(self, node: NodeRef, operation_id: str) -> None:
        """Delete this sweep's reservation (there is none when the cluster asks for none)."""
        name = self._sweep_reservation(operation_id)
        if any(r.get("ReservationName") == name for r in self._slurm("scontrol show reservation",
                                                                     self.slurm.reservations)):
            self._slurm(f"delete reservation {name}", self.slurm.delete_reservation, name)

    # -- checkpoint, stop, restore -----------------------------------------------------
    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str,
                   requires: dict[str, Any] | None = None) -> CheckpointResult:
        if is_bare_process(workload_id):  # in no job: the node's agent checkpoints it, as with the local back end
            return self.agents.checkpoint_bare(self._need_agent(node), workload_id, engine, operation_id)
        job_id = job_of(workload_id)
        job = self._job(job_id)
        if job is None:
            raise PermanentExecutorError(f"job {job_id} is no longer known to Slurm")
        record = read_record(job)
        if record.get("ck_op") == operation_id:
            self._requeue_held(job_id, record)
            return self._result(record, workload_id)
        if record.get("ck_op") and not record.get("restore_op") and _job_state(job) != "RUNNING":
            raise PermanentExecutorError(f"job {job_id} was already checkpointed by {record['ck_op']}")
        # A record of a move whose job runs again (released by hand, or from before releases cleared it) is over:
        # it never blocks the next campaign.
        prior = str(record.get("prior") or "") if record else str(job.get("admin_comment") or "")[:500]
        observed = workload_from_slurm(job)
        if _job_state(job) != "RUNNING" or observed is None or node.name not in observed.nodes:
            raise PermanentExecutorError(f"job {job_id} does not run on {node.name} ({_job_state(job).lower()})")
        if len(observed.nodes) > 1:
            raise PermanentExecutorError(f"job {job_id} runs on {len(observed.nodes)} nodes; gpusweep checkpoints "
                                         "single-node jobs only (the campaign's policy applies)")
        ref = self._need_agent(node)
        # GPUs it holds without having declared them count as its own (executors.base.held_gpus).
        gpus = observed.gpus or held_gpus(self.agents.gpu_users(ref), "slurm_job", job_id, workload_id)
        if requires is None:
            requires = portability.requirements(engine, self._portability_facts(node), gpus=gpus).as_dict()
        # The agent checks a restore against what it reads itself, so it gets the rule applied to its own facts.
        mine = portability.requirements(engine, self.agents.own_facts(ref), gpus=gpus)
        output = self._output_of(ref, workload_id)
        done = self.agents.checkpoint(ref, workload_id, engine, operation_id, requires=mine.as_dict())
        record = {"ck_op": operation_id, "ck": done.checkpoint_id, "sha256": done.sha256, "bytes": done.total_bytes,
                  "steps": done.steps, "engine": engine, "node": node.name, "endpoint": ref.endpoint, "dump": done.dump,
                  "requires": requires, "output": output, "prior": prior, "was": _constraints_of(job)}
        # The record first: a retry after a crash finds the checkpoint, then finishes the requeue.
        self._slurm(f"record checkpoint on job {job_id}", self.slurm.update_job, job_id,
                    admincomment=write_record(record))
        self._requeue_held(job_id, record)
        return self._result(record, workload_id)

    def _requeue_held(self, job_id: str, record: dict[str, Any]) -> None:
        job = self._job(job_id)
        if job is None or record.get("restore_op"):
            return
        if _held(job):
            return  # held already
        try:
            self.slurm.requeue(job_id, hold=True)
        except SlurmError as exc:
            again = self._job(job_id)
            if again is None or _job_state(again) != "PENDING":
                raise PermanentExecutorError(f"requeuehold of job {job_id}: {exc}") from None

    def _output_of(self, ref: NodeRef, workload_id: str) -> str:
        """What the requeue does to the job's output files, as its gpusweep-run read them (OUTPUT_MODES)."""
        listed = self.agents.client(ref).get("/v1/workloads").get("workloads", [])
        mode = next((str(w.get("output") or "") for w in listed if w.get("id") == workload_id), "")
        if mode == "site":  # the job asked for neither: slurm.conf's JobFileAppend decides (0 by default)
            appends = self._slurm("scontrol show config", self.slurm.config).get("JobFileAppend", "0") == "1"
            mode = "append" if appends else "truncate"
        return OUTPUT_MODES["kept" if mode == "truncate" else mode if mode in OUTPUT_MODES else ""]

    @staticmethod
    def _result(record: dict[str, Any], workload_id: str) -> CheckpointResult:
        steps = record.get("steps")
        return CheckpointResult(
            checkpoint_id=str(record["ck"]), sha256=str(record.get("sha256", "")),
            total_bytes=int(record.get("bytes") or 0), steps=int(steps) if steps is not None else None,
            manifest={"job": workload_id, "node": record.get("node"), "engine": record.get("engine"),
                      "requires": record.get("requires", {}),
                      **({"output": record["output"]} if record.get("output") else {})},
            dump=dict(record.get("dump") or {}))

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> str | None:
        """Cold restart: Slurm requeues the job, which starts again from its first line elsewhere; a bare process
        is stopped by its agent and nobody starts it again (``restarted_by``). Returns what the requeue does to
        the job's output files (OUTPUT_MODES)."""
        if is_bare_process(workload_id):
            self.agents.stop(self._need_agent(node), workload_id, operation_id)
            return None
        job_id = job_of(workload_id)
        job = self._job(job_id)
        if job is None:
            return None
        record = read_record(job)
        restarts = int(job.get("restart_cnt") or 0)
        if record.get("stop_op") != operation_id:
            # The site's own admin comment is kept in the record and put back when the node's sweep ends
            # (_end_stops); the run it stops (its restart count) tells a retry whether the requeue happened.
            prior = str(record.get("prior") or "") if record else str(job.get("admin_comment") or "")[:500]
            record = {**record, "stop_op": operation_id, "node": node.name, "prior": prior, "restarts": restarts,
                      "output": self._output_fate(node, workload_id)}
            self._slurm(f"record cold restart on job {job_id}", self.slurm.update_job, job_id,
                        admincomment=write_record(record))
        output = str(record.get("output") or OUTPUT_MODES[""])
        if _job_state(job) == "RUNNING" and restarts == record.get("restarts"):
            if output == OUTPUT_MODES["kept"]:
                # Where Slurm would truncate the output files, the node's agent stops the payload first (a
                # checkpoint of engine none), so its gpusweep-run keeps them for the requeued job, as after a move.
                try:
                    self.agents.stop(self._need_agent(node), workload_id, operation_id)
                except (PermanentExecutorError, InterruptedOperation):
                    output = OUTPUT_MODES[""]  # the wrapper is gone or refuses: the requeue goes on all the same
            self._slurm(f"requeue job {job_id}", self.slurm.requeue, job_id, False)
        return output

    def _output_fate(self, node: NodeRef, workload_id: str) -> str:
        """What a requeue does to the job's output files (OUTPUT_MODES), as its node's agent knows it ("not kept"
        for a job with no wrapper, or whose agent does not answer)."""
        ref = self._agent(node)
        if ref is None:
            return OUTPUT_MODES[""]
        try:
            return self._output_of(ref, workload_id)
        except ExecutorError:
            return OUTPUT_MODES[""]

    def _job_with(self, checkpoint_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        for job in self._slurm("squeue", self.slurm.jobs):
            record = read_record(job)
            if record.get("ck") == checkpoint_id:
                return dict(job), record
        raise PermanentExecutorError(f"no Slurm job carries checkpoint {checkpoint_id}")

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> RestoreResult:
        try:
            job, record = self._job_with(checkpoint_id)
        except PermanentExecutorError:
            ref = self._agent(target)
            if ref is not None and self.agents.holds_bare_checkpoint(ref, checkpoint_id):
                # A bare process's (in no job): the target's agent restores it from the shared checkpoint folder.
                return self.agents.restore(ref, checkpoint_id, operation_id)
            raise
        job_id = str(job.get("job_id"))
        done_by = record.get("restore_op")
        if done_by and done_by != operation_id:
            raise PermanentExecutorError(f"checkpoint {checkpoint_id} was restored already, by operation {done_by} "
                                         f"on {record.get('restore_to')}")
        if done_by and record.get("restore_to") != target.name:
            raise PermanentExecutorError(f"checkpoint {checkpoint_id} is being restored on {record['restore_to']}, "
                                         f"not {target.name}")
        if not done_by:
            wrong = portability.mismatches(portability.from_dict(record.get("requires") or {}),
                                           self._portability_facts(target))
            if wrong:
                report = ", ".join(f"{k}: {want!r} != {got!r}" for k, (want, got) in sorted(wrong.items()))
                raise PermanentExecutorError(f"checkpoint {checkpoint_id} cannot be restored on {target.name}: "
                                             f"{report}")
            if not self.connection.get("shared_checkpoint_dir") and target.name != record.get("node"):
                self._transfer(record, target, operation_id)
            constraint = self._constraint(job, record, target)
            home = self._admit_home(job, record, target, operation_id)
            if home:
                constraint["reservation"] = home
            record = {**record, "restore_op": operation_id, "restore_to": target.name,
                      **({"home": home, "drain_reason": str(self._node(target.name).get("reason") or "")}
                         if home else {})}
            self._slurm(f"constrain job {job_id}", self.slurm.update_job, job_id, admincomment=write_record(record),
                        **constraint)
        if not record.get("home"):
            return self._wait_restored(job_id, checkpoint_id, target)
        self._resume(target, operation_id)  # the reservation admits this job alone
        try:
            return self._wait_restored(job_id, checkpoint_id, target)
        except (PermanentExecutorError, TemporaryExecutorError):
            self._give_up_home(job_id, record, target, operation_id)
            raise

    def _give_up_home(self, job_id: str, record: dict[str, Any], target: NodeRef, operation_id: str) -> None:
        """A restore on the job's own node failed: the node is drained again with gpusweep's reason (never
        left taking work while its job is not back), and the job may be restored elsewhere or released."""
        self._slurm(f"drain {target.name} again", self.slurm.update_node, target.name, state="DRAIN",
                    reason=str(record.get("drain_reason") or f"{MARK} campaign {campaign_of(operation_id)} "
                                                              f"op {operation_id}"))
        job = self._job(job_id)
        if job is not None and _job_state(job) == "PENDING":
            left = {k: v for k, v in record.items() if k not in ("restore_op", "restore_to", "home", "drain_reason")}
            self._slurm(f"record failed restore on job {job_id}", self.slurm.update_job, job_id,
                        admincomment=write_record(left), reservation="")
        self._end_home(target, operation_id)

    def release_held(self, node: NodeRef, workload_id: str, checkpoint_id: str, operation_id: str) -> str:
        """No node takes the checkpoint: the job goes back to Slurm with its own constraints (its node list,
        exclusions, features and reservation from before the move) and its own admin comment, released; its
        gpusweep-run restores the checkpoint where Slurm starts it if it is valid there, else starts it cold.
        The record goes, so no later campaign finds a move it has to wait for."""
        job_id = job_of(workload_id)
        job = self._requeued(job_id)
        if job is None:
            return f"job {job_id} is no longer known to Slurm"
        record = read_record(job)
        if record.get("ck") == checkpoint_id:
            was = dict(record.get("was") or {})
            self._slurm(f"release job {job_id} to Slurm", self.slurm.update_job, job_id,
                        admincomment=str(record.get("prior") or ""), starttime="now",
                        **{k: str(was.get(k) or "") for k in ("nodelist", "excnodelist", "features", "reservation")})
            job = self._job(job_id) or job
        if _held(job):
            self._slurm(f"release job {job_id}", self.slurm.release, job_id)
        return ("released to Slurm: the job starts again where its own constraints allow, from its checkpoint "
                "where it is valid there, else from its first line")

    def _requeued(self, job_id: str) -> dict[str, Any] | None:
        """The job once its requeue has landed (a requeue takes a moment: a release before it would be undone
        by the hold it brings); None when Slurm no longer knows it."""
        until = time.monotonic() + self.option("restore_wait_s", 60)
        while True:
            job = self._job(job_id)
            if job is None or _job_state(job) not in ("RUNNING", "COMPLETING"):
                return job
            if time.monotonic() > until:
                raise TemporaryExecutorError(f"job {job_id} is still {_job_state(job).lower()}: its requeue has "
                                             "not landed")
            time.sleep(self.option("poll_s", 0.5))

    def _transfer(self, record: dict[str, Any], target: NodeRef, operation_id: str) -> None:
        """No folder shared by the nodes: the target's agent fetches the images from the source's (a token for
        this checkpoint and this receiver; every file checked against the manifest, the manifest against the
        digest recorded at the checkpoint)."""
        source = NodeRef(target.cluster, str(record.get("node")), endpoint=str(record.get("endpoint") or ""))
        if not source.endpoint:
            raise PermanentExecutorError(f"checkpoint {record.get('ck')}: the source node's agent is not recorded")
        share = self.agents.client(source).operation("/v1/share", f"{operation_id}-share",
                                                     checkpoint_id=record["ck"], to=target.identity)
        self.agents.client(self._need_agent(target)).operation(
            "/v1/fetch", f"{operation_id}-fetch", checkpoint_id=record["ck"], source=source.endpoint,
            token=share["token"], sha256=record["sha256"])

    def _constraint(self, job: dict[str, Any], record: dict[str, Any], target: NodeRef) -> dict[str, str]:
        """Where the job may start again: the target, never a node that publishes versions the image
        cannot run on, and the version features the image needs where the target publishes them."""
        needed = portability.from_dict(record.get("requires") or {})
        nodes = self._slurm("sinfo", self.slurm.nodes)
        excluded = []
        target_features: list[str] = []
        for node in nodes:
            observed = node_from_slurm(node, self.features)
            if observed.name == target.name:
                target_features = str(node.get("active_features") or node.get("features") or "").split(",")
                continue
            facts = portability.node_facts(observed.gpu_model or "", observed.components)
            published = {k: v for k, v in facts.items() if k in needed.must or k in needed.if_reported}
            if any(k in published and published[k] != v for k, v in {**needed.must, **needed.if_reported}.items()):
                excluded.append(observed.name)
        # starttime: Slurm delays a requeued job's begin time; the checkpoint is ready now.
        fields = {"nodelist": target.name, "excnodelist": ",".join(sorted(excluded)) or "", "starttime": "now"}
        wanted = [f"{prefix}{needed.must[c]}" for prefix, c in self.features.items()
                  if needed.must.get(c) and f"{prefix}{needed.must[c]}" in target_features]
        own = str(job.get("features") or "")
        if wanted:
            fields["features"] = "&".join([*([own] if own else []), *[w for w in wanted if w not in own.split("&")]])
        if not fields["excnodelist"]:
            fields.pop("excnodelist")
        return fields

    def _wait_restored(self, job_id: str, checkpoint_id: str, target: NodeRef) -> RestoreResult:
        ref = self._need_agent(target)
        client = self.agents.client(ref)
        until = time.monotonic() + self.option("restore_wait_s", 60)
        while True:
            job = self._job(job_id)
            if job is None or _job_state(job) in ENDED:
                raise PermanentExecutorError(f"job {job_id} restoring {checkpoint_id} ended "
                                             f"({_job_state(job).lower() if job else 'gone'})")
            if _held(job):  # requeued and held (a requeue takes a moment to land): now it may start
                self._slurm(f"release job {job_id}", self.slurm.release, job_id)
            elif _job_state(job) == "PENDING" and job.get("state_reason") == "BeginTime":
                # A requeue that landed after the constraint delays the begin time again; the image is ready now.
                self._slurm(f"start job {job_id}", self.slurm.update_job, job_id, starttime="now")
            on_target = _job_state(job) == "RUNNING" and target.name in _nodes(job)
            if on_target:
                state = client.get(f"/v1/checkpoints/{checkpoint_id}")
                by = str((state.get("restored") or {}).get("by") or "")
                if by and by != ref.identity:
                    raise PermanentExecutorError(f"checkpoint {checkpoint_id} was restored by {by}, not {ref.identity}")
                if by:
                    listed = client.get("/v1/workloads").get("workloads", [])
                    steps = next((w.get("steps") for w in listed if w.get("id") == f"slurm-{job_id}"), None)
                    return RestoreResult(workload_id=f"slurm-{job_id}", node=target.identity,
                                         steps=int(steps) if steps is not None else None)
            if time.monotonic() > until:
                raise TemporaryExecutorError(f"job {job_id} is {_job_state(job).lower()} "
                                             f"({job.get('state_reason')}); checkpoint {checkpoint_id} not restored "
                                             f"on {target.name} yet")
            time.sleep(self.option("poll_s", 0.5))

    # -- patch, reboot, verify ---------------------------------------------------------
    def patch(self, node: NodeRef, component: str, version: str, operation_id: str,
              packages: dict[str, str] | None = None) -> PatchResult:
        return self.agents.patch(self._need_agent(node), component, version, operation_id, packages)

    def health(self, node: NodeRef, expected: dict[str, str], gates: HealthGates,
               operation_id: str) -> HealthResult:
        return self.agents.health(self._need_agent(node), expected, gates, operation_id)

    def rollback(self, node: NodeRef, operation_id: str) -> RollbackResult:
        return self.agents.rollback(self._need_agent(node), operation_id)

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        info = self._node(node.name)
        reason = str(info.get("reason") or "")
        asked = re.search(rf"reboot {re.escape(operation_id)} at (\d+)", reason)
        if asked is None:
            if not reason.startswith(MARK):
                raise PermanentExecutorError(f"node {node.name} is not drained by gpusweep; it is not rebooted")
            since = int(time.time())
            base = reason.split("; reboot ")[0]
            # Recorded before asking: a retry waits for this reboot instead of asking for another.
            self._slurm(f"record reboot of {node.name}", self.slurm.update_node, node.name, state="DRAIN",
                        reason=f"{base}; reboot {operation_id} at {since}")
            if self.reboot_via == "slurm":
                self._slurm(f"reboot {node.name}", self.slurm.reboot, node.name,
                            f"{base}; reboot {operation_id} at {since}")
        else:
            since = int(asked.group(1))
        if self.reboot_via == "agent":
            self.agents.reboot(self._need_agent(node), operation_id)
        self._wait_registered(node, since)

    def _wait_registered(self, node: NodeRef, since: int) -> None:
        """slurmd of `node` started at or after `since` and answers."""
        until = time.monotonic() + self.option("reboot_wait_s", 120)
        while True:
            info = self._node(node.name)
            started = int(info.get("slurmd_start_time") or 0)
            if started >= since and not _state_words(info) & {"not_responding", "down", "reboot_issued"}:
                return
            if time.monotonic() > until:
                raise TemporaryExecutorError(f"slurmd on {node.name} has not registered since the reboot "
                                             f"(started {started}, reboot asked at {since})")
            time.sleep(self.option("poll_s", 0.5))

    def verify(self, node: NodeRef) -> VerifyResult:
        info = self._node(node.name)
        ref = self._agent(node)
        health = self.agents.client(ref).get("/v1/health") if ref is not None else {"status": "ok"}
        agent = self.agents.facts(ref) if ref is not None else {}
        self._publish(info, agent)
        info = self._node(node.name)
        words = _state_words(info)
        responding = not words & {"not_responding", "down", "fail", "reboot_issued", "reboot_requested"}
        published = self._published(info)
        versions = {**published, **agent}
        stale = {c: (published.get(c), v) for c, v in agent.items()
                 if c in self.features.values() and c in published and published[c] != v}
        healthy = responding and health.get("status") == "ok" and not stale
        output = (f"slurm {'+'.join(sorted(words))}, features {info.get('active_features') or info.get('features')}; "
                  f"agent {health.get('status')} {agent}" + (f"; features disagree: {stale}" if stale else ""))
        return VerifyResult(healthy=healthy, versions=versions, output=output)

    def _publish(self, info: dict[str, Any], agent: dict[str, str]) -> None:
        """Where the node publishes versions as features, make them say what the agent reports."""
        current = [f for f in str(info.get("features") or "").split(",") if f]
        updated = []
        for feature in current:
            for prefix, component in self.features.items():
                if feature.startswith(prefix) and agent.get(component):
                    feature = f"{prefix}{agent[component]}"
            updated.append(feature)
        active = [f for f in str(info.get("active_features") or "").split(",") if f]
        if updated != current or sorted(active) != sorted(updated):
            self._slurm(f"update features of {info.get('name')}", self.slurm.update_node, str(info.get("name")),
                        availablefeatures=",".join(updated), activefeatures=",".join(updated))

    # -- maintenance reservations per wave ---------------------------------------------
    @staticmethod
    def reservation_name(campaign_id: int | str, wave: int) -> str:
        return f"{RESERVATION_PREFIX}c{campaign_id}-w{wave}"

    def reserve(self, name: str, nodes: list[str], start: str, minutes: int) -> None:
        """A maintenance reservation for one wave (idempotent: an existing one of that name is kept)."""
        if not name.startswith(RESERVATION_PREFIX):
            raise PermanentExecutorError(f"reservation {name!r}: gpusweep's names begin with {RESERVATION_PREFIX}")
        existing = {r.get("ReservationName") for r in self._slurm("scontrol show reservation",
                                                                  self.slurm.reservations)}
        if name in existing:
            return
        self._slurm(f"create reservation {name}", self.slurm.create_reservation, name, nodes, start, minutes,
                    "maint,ignore_jobs", self.reservation_users)

    def wave_reservation(self, campaign_id: int, wave: int) -> str:
        return self.reservation_name(campaign_id, wave) if self.reservation_kind == "wave" else ""

    def reserve_wave(self, name: str, nodes: list[NodeRef], minutes: int) -> None:
        try:
            self.reserve(name, [n.name for n in nodes], "now", minutes)
        except PermanentExecutorError:
            # Two admissions at once: the other one's create won, and that reservation serves.
            if not any(r.get("ReservationName") == name for r in self._slurm("scontrol show reservation",
                                                                             self.slurm.reservations)):
                raise

    def release_wave(self, name: str) -> None:
        self.release_reservation(name)

    def release_reservation(self, name: str) -> None:
        if not name.startswith(RESERVATION_PREFIX):
            raise PermanentExecutorError(f"reservation {name!r} is not gpusweep's; it is left as it is")
        existing = {r.get("ReservationName") for r in self._slurm("scontrol show reservation",
                                                                  self.slurm.reservations)}
        if name in existing:
            self._slurm(f"delete reservation {name}", self.slurm.delete_reservation, name)

