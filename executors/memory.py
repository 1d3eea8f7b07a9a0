"""A test-double back end, like Django's locmem email back end: a fleet that lives in memory.

Used by unit tests, the sweep benchmark and the demo when no agents run. It behaves like the
agent API where the campaign engine can tell the difference: operation ids are idempotent, a
checkpoint records what its image needs of a target (executors.portability, the same rule the
planner and the engine use) and a restore on a node where that does not hold is refused, a patch
takes effect at the reboot (a livepatch at once, in or out of maintenance), and demo workloads
count steps so a test can see that a moved workload continued where it stopped.

State is process-local by default. With ``state_file`` (option) or
``GPUSWEEP_MEMORY_EXECUTOR_STATE`` (environment) it is a folder of small JSON files (one per
node, checkpoint and operation) shared by every process, each file edited under its own
``flock``: several Celery workers (and a test killing them) see one fleet, and operations on
different nodes never wait for each other. Every operation sleeps ``step_seconds`` (option or
``GPUSWEEP_MEMORY_EXECUTOR_STEP_S``) before it takes effect: a worker killed during the sleep
leaves nothing half done.

Faults are injected with ``inject(op, node, kind, times)``: the next `times` calls of `op` on
`node` ("*" for any) raise a temporary or permanent error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from executors import portability
from executors.base import (
    LIVEPATCH,
    OS_PACKAGES,
    CheckpointResult,
    Executor,
    GpuUser,
    HealthCheckResult,
    HealthGates,
    HealthResult,
    NodeRef,
    PatchResult,
    PermanentExecutorError,
    RestoreResult,
    RollbackResult,
    TemporaryExecutorError,
    VerifyResult,
    WorkloadInfo,
    versions_check,
)

_LOCK = threading.RLock()
_MEMORY: dict[str, dict[str, Any]] = {"nodes": {}, "checkpoints": {}, "ops": {}, "faults": {}}
KINDS = ("nodes", "checkpoints", "ops", "faults")


def _file_name(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else f"%{ord(ch):02x}" for ch in key) + ".json"


class Store:
    """Records by kind and key, each edited under its own lock (a file lock when shared)."""

    def __init__(self, path: str | None) -> None:
        self.root = Path(path) if path else None

    @contextlib.contextmanager
    def edit(self, kind: str, key: str) -> Iterator[dict[str, Any]]:
        """The record (empty when new), locked for the block and written back when it ends."""
        if self.root is None:
            with _LOCK:
                record = _MEMORY[kind].setdefault(key, {})
                yield record
            return
        folder = self.root / kind
        (folder / ".locks").mkdir(parents=True, exist_ok=True)
        path = folder / _file_name(key)
        # The lock is a file of its own that is never replaced: a lock on the data file would be
        # lost to whoever waited on it when the rename below swaps the file.
        with open(folder / ".locks" / path.name, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                try:
                    text = path.read_text(encoding="utf-8")
                except FileNotFoundError:
                    text = ""
                record = json.loads(text) if text.strip() else {}
                before = json.dumps(record, sort_keys=True)
                yield record
                after = json.dumps(record, sort_keys=True)
                if after != before:
                    # A temporary file and a rename: a process killed mid-write leaves the old record.
                    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
                    tmp.write_text(after, encoding="utf-8")
                    os.replace(tmp, path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self, kind: str, key: str) -> dict[str, Any] | None:
        if self.root is None:
            with _LOCK:
                found = _MEMORY[kind].get(key)
                return json.loads(json.dumps(found)) if found else None
        path = self.root / kind / _file_name(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        return json.loads(text) if text.strip() else None

    def keys(self, kind: str) -> list[str]:
        if self.root is None:
            with _LOCK:
                return sorted(k for k, v in _MEMORY[kind].items() if v)
        folder = self.root / kind
        if not folder.exists():
            return []
        found = []
        for path in folder.glob("*.json"):
            record = self.read(kind, _key_of(path.name))
            if record:
                found.append(_key_of(path.name))
        return sorted(found)

    def clear(self) -> None:
        if self.root is None:
            with _LOCK:
                for kind in KINDS:
                    _MEMORY[kind].clear()
            return
        shutil.rmtree(self.root, ignore_errors=True)


def _key_of(file_name: str) -> str:
    stem = file_name[:-len(".json")]
    out, index = [], 0
    while index < len(stem):
        if stem[index] == "%":
            out.append(chr(int(stem[index + 1:index + 3], 16)))
            index += 3
        else:
            out.append(stem[index])
            index += 1
    return "".join(out)


def _state_path(options: dict[str, Any]) -> str | None:
    return str(options.get("state_file") or os.environ.get("GPUSWEEP_MEMORY_EXECUTOR_STATE", "")) or None


def _steps(workload: dict[str, Any], now: float) -> int:
    if workload["state"] != "running":
        return int(workload["steps_base"])
    return int(workload["steps_base"] + (now - workload["resumed_at"]) * workload["rate"])


def _facts(data: dict[str, Any]) -> dict[str, str]:
    return portability.node_facts(data["gpu_model"], data["versions"])


class Fleet:
    """Direct access to the in-memory fleet for tests, the benchmark and the demo."""

    def __init__(self, state_file: str | None = None) -> None:
        self.store = Store(state_file or _state_path({}))

    def reset(self) -> None:
        self.store.clear()

    def add_node(
        self, cluster: str, name: str, *, gpu_model: str = "H100", gpu_count: int = 8,
        versions: dict[str, str] | None = None,
    ) -> None:
        with self.store.edit("nodes", f"{cluster}/{name}") as node:
            node.clear()
            node.update({
                "gpu_model": gpu_model, "gpu_count": gpu_count, "versions": dict(versions or {}),
                "installed": {}, "maintenance": False, "healthy": True, "workloads": {},
                "patches": {}, "reboots": 0,
            })

    def add_workload(
        self, cluster: str, node: str, workload_id: str, *, name: str = "", gpus: int = 1,
        engine: str = "criu", rate: float = 10.0, **fingerprint: str,
    ) -> None:
        with self.store.edit("nodes", f"{cluster}/{node}") as data:
            data["workloads"][workload_id] = {
                "id": workload_id, "name": name or workload_id, "gpus": gpus, "engine": engine,
                "state": "running", "steps_base": 0, "resumed_at": time.time(), "rate": rate,
                "fingerprint": fingerprint,
            }

    def inject(self, op: str, node: str = "*", kind: str = "permanent", times: int = 1) -> None:
        with self.store.edit("faults", "all") as faults:
            faults.setdefault("list", []).append({"op": op, "node": node, "kind": kind, "times": times})

    def finish(self, node: str, workload_id: str) -> None:
        """The workload ends by itself (what a policy that waits for completion waits for)."""
        with self.store.edit("nodes", node) as data:
            data["workloads"][workload_id]["state"] = "exited"

    def hold(self, node: str, by: str, reason: str = "") -> None:
        """Someone other than gpusweep takes the node out of service (a repair, an admin's drain)."""
        with self.store.edit("nodes", node) as data:
            data.setdefault("holds", {})[by] = reason

    def release(self, node: str, by: str) -> None:
        with self.store.edit("nodes", node) as data:
            data.setdefault("holds", {}).pop(by, None)

    def add_gpu_user(self, node: str, pid: int, name: str, owner_kind: str = "process", owner_id: str = "") -> None:
        """A process holding a GPU on the node, as the node's agent would find it."""
        with self.store.edit("nodes", node) as data:
            data.setdefault("gpu_users", []).append({"pid": pid, "name": name, "owner_kind": owner_kind,
                                                     "owner_id": owner_id})

    def fail_check(self, node: str, check: str, output: str = "", times: int | None = None) -> None:
        """The node's health check `check` fails from now on (or its next `times` runs), printing
        `output` ("" clears it)."""
        with self.store.edit("nodes", node) as data:
            failing = data.setdefault("failing_checks", {})
            left = data.setdefault("failing_times", {})
            if output:
                failing[check] = output
                if times is not None:
                    left[check] = times
            else:
                failing.pop(check, None)
                left.pop(check, None)

    def set_healthy(self, node: str, healthy: bool) -> None:
        with self.store.edit("nodes", node) as data:
            data["healthy"] = healthy

    def snapshot(self) -> dict[str, Any]:
        """A copy of the fleet with every running workload's current step count filled in."""
        now = time.time()
        copy: dict[str, Any] = {kind: {} for kind in KINDS}
        for kind in ("nodes", "checkpoints"):
            for key in self.store.keys(kind):
                copy[kind][key] = self.store.read(kind, key)
        for node in copy["nodes"].values():
            for workload in node["workloads"].values():
                workload["steps"] = _steps(workload, now)
        return copy


class MemoryExecutor(Executor):
    name = "memory"
    # Nothing restarts a stopped workload here (no scheduler), as with agents addressed directly.
    restarts_cold_starts = ""

    @property
    def store(self) -> Store:
        return Store(_state_path(self.options))

    @property
    def step_seconds(self) -> float:
        raw = self.options.get("step_seconds", os.environ.get("GPUSWEEP_MEMORY_EXECUTOR_STEP_S", "0"))
        return float(raw)

    # -- plumbing --------------------------------------------------------------------
    @contextlib.contextmanager
    def _node(self, store: Store, node: NodeRef) -> Iterator[dict[str, Any]]:
        with store.edit("nodes", node.identity) as data:
            if not data:
                raise PermanentExecutorError(f"node {node.identity} is not in the memory fleet")
            yield data

    def _fault(self, store: Store, op: str, node: NodeRef) -> Exception | None:
        """Consume a matching injected fault; the caller raises it after the record is written back."""
        if store.root is not None and not (store.root / "faults").exists():
            return None
        with store.edit("faults", "all") as faults:
            for fault in faults.get("list", []):
                if fault["op"] == op and fault["node"] in ("*", node.identity) and fault["times"] > 0:
                    fault["times"] -= 1
                    error = TemporaryExecutorError if fault["kind"] == "temporary" else PermanentExecutorError
                    return error(f"injected {fault['kind']} fault in {op} on {node.identity}")
        return None

    def _run(self, op: str, node: NodeRef, operation_id: str, body: Callable[[Store], Any]) -> Any:
        """Run `body(store)` once per operation id; a repeat returns the recorded result."""
        store = self.store
        done = store.read("ops", operation_id)
        if done:
            return done["result"]
        fault = self._fault(store, op, node)
        if fault is not None:
            raise fault
        if self.step_seconds:
            time.sleep(self.step_seconds)
        with store.edit("ops", operation_id) as record:
            if record:
                return record["result"]
            result = body(store)
            record.update(result=result, op=op, node=node.identity)
            return result

    # -- planning and reads ------------------------------------------------------------
    def reachable(self, node: NodeRef) -> str:
        return "" if self.store.read("nodes", node.identity) else f"{node.identity} is not in the memory fleet"

    def maintenance_hold(self, node: NodeRef) -> str:
        holds = (self.store.read("nodes", node.identity) or {}).get("holds") or {}
        return "; ".join(f"held by {by}" + (f": {why}" if why else "") for by, why in sorted(holds.items()))

    def facts(self, node: NodeRef) -> dict[str, str]:
        with self._node(self.store, node) as data:
            return dict(data["versions"])

    def gpu_users(self, node: NodeRef) -> list[GpuUser]:
        with self._node(self.store, node) as data:
            return [GpuUser(**u) for u in data.get("gpu_users") or []]

    def list_workloads(self, node: NodeRef) -> list[WorkloadInfo]:
        now = time.time()
        with self._node(self.store, node) as data:
            return [
                WorkloadInfo(
                    id=w["id"], name=w["name"], gpus=w["gpus"], checkpoint_engine=w["engine"], state=w["state"],
                    steps=_steps(w, now), fingerprint=w["fingerprint"],
                )
                for w in data["workloads"].values()
                if w["state"] == "running"
            ]

    # -- steps -----------------------------------------------------------------------
    def _set_maintenance(self, op: str, node: NodeRef, operation_id: str, enabled: bool) -> None:
        def body(store: Store) -> None:
            with self._node(store, node) as data:
                data["maintenance"] = enabled

        self._run(op, node, operation_id, body)

    def drain(self, node: NodeRef, operation_id: str) -> None:
        self._set_maintenance("drain", node, operation_id, True)

    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str,
                   requires: dict[str, Any] | None = None) -> CheckpointResult:
        def body(store: Store) -> dict[str, Any]:
            with self._node(store, node) as data:
                workload = data["workloads"].get(workload_id)
                if workload is None or workload["state"] != "running":
                    raise PermanentExecutorError(f"workload {workload_id} is not running on {node.identity}")
                steps = _steps(workload, time.time())
                # frozen_at: when it stopped running; its restore records how long it was frozen.
                workload.update(state="checkpointed", steps_base=steps, frozen_at=time.time())
                needed = requires if requires is not None else portability.requirements(
                    engine, _facts(data), gpus=int(workload["gpus"]),
                    inference_engine=workload["fingerprint"].get("engine", ""),
                    engine_version=workload["fingerprint"].get("engine_version", ""),
                    model_name=workload["fingerprint"].get("model_name", ""),
                    model_version=workload["fingerprint"].get("model_version", "")).as_dict()
                snapshot = dict(workload)
            checkpoint_id = f"ck-{uuid.uuid4().hex[:12]}"
            image = json.dumps({"workload": snapshot, "requires": needed}, sort_keys=True)
            digest = hashlib.sha256(image.encode()).hexdigest()
            with store.edit("checkpoints", checkpoint_id) as checkpoint:
                checkpoint.update(workload=snapshot, requires=needed, restored_as=None, source=node.identity,
                                  sha256=digest, engine=engine)
            return {"checkpoint_id": checkpoint_id, "sha256": digest, "total_bytes": len(image), "steps": steps,
                    "requires": needed}

        result = self._run("checkpoint", node, operation_id, body)
        return CheckpointResult(
            checkpoint_id=result["checkpoint_id"], sha256=result["sha256"], total_bytes=result["total_bytes"],
            steps=result["steps"], manifest={"requires": result["requires"], "engine": engine},
        )

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> None:
        def body(store: Store) -> None:
            with self._node(store, node) as data:
                workload = data["workloads"].get(workload_id)
                if workload is not None:
                    workload["state"] = "stopped"

        self._run("stop", node, operation_id, body)

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> RestoreResult:
        def body(store: Store) -> dict[str, Any]:
            with store.edit("checkpoints", checkpoint_id) as checkpoint:
                if not checkpoint:
                    raise PermanentExecutorError(f"checkpoint {checkpoint_id} does not exist")
                if checkpoint["restored_as"]:
                    # Never two live copies of one workload.
                    raise PermanentExecutorError(f"checkpoint {checkpoint_id} was already restored")
                with self._node(store, target) as data:
                    if data["maintenance"] or data.get("holds"):
                        # As the real agent: a node in maintenance admits no work, restores included.
                        raise PermanentExecutorError(f"{target.identity} is in maintenance and admits no work")
                    wrong = portability.mismatches(portability.from_dict(checkpoint["requires"]), _facts(data))
                    if wrong:
                        raise PermanentExecutorError(f"incompatible restore target {target.identity}: {wrong}")
                    new_id, now = f"wl-{uuid.uuid4().hex[:12]}", time.time()
                    taken = checkpoint["workload"]
                    workload = dict(taken, id=new_id, state="running", resumed_at=now,
                                    frozen_s=now - float(taken.get("frozen_at") or now))
                    data["workloads"][new_id] = workload
                checkpoint["restored_as"] = f"{target.identity}:{new_id}"
                return {"workload_id": new_id, "steps": workload["steps_base"]}

        result = self._run("restore", target, operation_id, body)
        return RestoreResult(workload_id=result["workload_id"], node=target.identity, steps=result["steps"])

    def patch(self, node: NodeRef, component: str, version: str, operation_id: str,
              packages: dict[str, str] | None = None) -> PatchResult:
        def body(store: Store) -> dict[str, Any]:
            with self._node(store, node) as data:
                # A livepatch (the running kernel) or OS packages' update: in place, no drain, no reboot.
                live = component in (LIVEPATCH, OS_PACKAGES)
                if not data["maintenance"] and not live:
                    raise PermanentExecutorError(f"{node.identity} is not in maintenance; refusing to patch")
                before = data["versions"].get(component, "")
                # What a rollback puts back (the first patch of a component in a campaign's sweep).
                data.setdefault("previous", {}).setdefault(component, before)
                data["versions" if live else "installed"][component] = version
                data["patches"][component] = data["patches"].get(component, 0) + 1
                # The exact packages installed, as a package manager would report them.
                data.setdefault("packages", {}).update(packages or {})
                return {"before": before, "after": version, "packages": dict(packages or {})}

        result = self._run("patch", node, operation_id, body)
        return PatchResult(component=component, before=result["before"], after=result["after"], output="memory",
                           packages=result["packages"])

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        def body(store: Store) -> None:
            with self._node(store, node) as data:
                data["versions"].update(data["installed"])
                data["installed"] = {}
                data["reboots"] += 1

        self._run("reboot", node, operation_id, body)

    def verify(self, node: NodeRef) -> VerifyResult:
        if self.step_seconds:
            time.sleep(self.step_seconds)
        store = self.store
        fault = self._fault(store, "verify", node)
        with self._node(store, node) as data:
            result = VerifyResult(healthy=data["healthy"], versions=dict(data["versions"]),
                                  output=f"memory: healthy={data['healthy']}")
        if fault is not None:
            raise fault
        return result

    def health(self, node: NodeRef, expected: dict[str, str], gates: HealthGates,
               operation_id: str) -> HealthResult:
        def body(store: Store) -> list[dict[str, Any]]:
            with self._node(store, node) as data:
                checks = [dataclasses.asdict(versions_check(expected, data["versions"]))]
                names = ["gpus", *(["dcgm"] if gates.dcgm_level else []),
                         *(f"site:{n}" for n in (gates.site_checks or ()))]
                failing = dict(data.get("failing_checks") or {})
                for name, left in list((data.get("failing_times") or {}).items()):
                    if left <= 1:  # this run is the last that fails
                        data["failing_times"].pop(name)
                        data["failing_checks"].pop(name, None)
                    else:
                        data["failing_times"][name] = left - 1
                for name in dict.fromkeys([*names, *failing]):
                    bad = failing.get(name)
                    checks.append({"name": name, "status": "failed" if bad else "passed",
                                   "summary": (bad or "memory: passed").splitlines()[0][:300], "output": bad or "",
                                   "detail": {}})
                return checks

        checks = self._run("health", node, operation_id, body)
        return HealthResult(tuple(HealthCheckResult(**c) for c in checks))

    def rollback(self, node: NodeRef, operation_id: str) -> RollbackResult:
        def body(store: Store) -> dict[str, str]:
            with self._node(store, node) as data:
                previous = dict(data.pop("previous", {}) or {})
                data["installed"] = dict(previous)  # back at the next reboot
                return previous

        previous = self._run("rollback", node, operation_id, body)
        return RollbackResult(components=previous, output="memory: previous versions reinstalled")

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        self._set_maintenance("return", node, operation_id, False)

    def undo(self, node: NodeRef, operation_id: str) -> None:
        self._set_maintenance("undo", node, operation_id, False)
