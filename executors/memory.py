"""A test-double back end, like Django's locmem email back end: a fleet that lives in memory.

Used by unit tests, the sweep benchmark and the demo when no agents run. It behaves like the
agent API where the campaign engine can tell the difference: operation ids are idempotent, a
checkpoint records a fingerprint (GPU model, driver, CUDA, engine) and a restore on a node that
differs is refused, a patch takes effect at the reboot, and demo workloads count steps so a test
can see that a moved workload continued where it stopped.

State is process-local by default. With ``state_file`` (option) or
``GPUSWEEP_MEMORY_EXECUTOR_STATE`` (environment) it is a JSON file shared under an exclusive
``flock`` by every process, so several Celery workers (and a test killing them) see one fleet.
Every operation sleeps ``step_seconds`` (option or ``GPUSWEEP_MEMORY_EXECUTOR_STEP_S``) before it
takes effect: a worker killed during the sleep leaves nothing half done.

Faults are injected with ``inject(op, node, kind, times)``: the next `times` calls of `op` on
`node` ("*" for any) raise a temporary or permanent error.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from executors.base import (
    CheckpointResult,
    Executor,
    NodeRef,
    PatchResult,
    PermanentExecutorError,
    RestoreResult,
    TemporaryExecutorError,
    VerifyResult,
    WorkloadInfo,
)

FINGERPRINT_COMPONENTS = ("driver", "cuda")
_LOCK = threading.RLock()
_STATE: dict[str, Any] = {}


def _empty() -> dict[str, Any]:
    return {"nodes": {}, "checkpoints": {}, "ops": {}, "faults": [], "seq": 0, "log": []}


@contextlib.contextmanager
def _state(path: str | None) -> Iterator[dict[str, Any]]:
    """The fleet, locked for the duration of the block, written back when it ends."""
    if not path:
        with _LOCK:
            if not _STATE:
                _STATE.update(_empty())
            yield _STATE
        return
    with _LOCK, open(path, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            text = handle.read()
            state = json.loads(text) if text.strip() else _empty()
            yield state
            # Write to a temporary file and rename, so a process killed mid-write leaves the old state.
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as out:
                json.dump(state, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _state_path(options: dict[str, Any]) -> str | None:
    return str(options.get("state_file") or os.environ.get("GPUSWEEP_MEMORY_EXECUTOR_STATE", "")) or None


def _steps(workload: dict[str, Any], now: float) -> int:
    if workload["state"] != "running":
        return int(workload["steps_base"])
    return int(workload["steps_base"] + (now - workload["resumed_at"]) * workload["rate"])


class Fleet:
    """Direct access to the in-memory fleet for tests, the benchmark and the demo."""

    def __init__(self, state_file: str | None = None) -> None:
        self.path = state_file or _state_path({})

    def reset(self) -> None:
        if self.path:
            Path(self.path).unlink(missing_ok=True)
        with _LOCK:
            _STATE.clear()

    def add_node(
        self, cluster: str, name: str, *, gpu_model: str = "H100", gpu_count: int = 8,
        versions: dict[str, str] | None = None,
    ) -> None:
        with _state(self.path) as st:
            st["nodes"][f"{cluster}/{name}"] = {
                "gpu_model": gpu_model, "gpu_count": gpu_count, "versions": dict(versions or {}),
                "installed": {}, "maintenance": False, "healthy": True, "workloads": {},
                "patches": {}, "reboots": 0,
            }

    def add_workload(
        self, cluster: str, node: str, workload_id: str, *, name: str = "", gpus: int = 1,
        engine: str = "criu", rate: float = 10.0, **fingerprint: str,
    ) -> None:
        with _state(self.path) as st:
            st["nodes"][f"{cluster}/{node}"]["workloads"][workload_id] = {
                "id": workload_id, "name": name or workload_id, "gpus": gpus, "engine": engine,
                "state": "running", "steps_base": 0, "resumed_at": time.time(), "rate": rate,
                "fingerprint": fingerprint,
            }

    def inject(self, op: str, node: str = "*", kind: str = "permanent", times: int = 1) -> None:
        with _state(self.path) as st:
            st["faults"].append({"op": op, "node": node, "kind": kind, "times": times})

    def finish(self, node: str, workload_id: str) -> None:
        """The workload ends by itself (what a policy that waits for completion waits for)."""
        with _state(self.path) as st:
            st["nodes"][node]["workloads"][workload_id]["state"] = "exited"

    def set_healthy(self, node: str, healthy: bool) -> None:
        with _state(self.path) as st:
            st["nodes"][node]["healthy"] = healthy

    def snapshot(self) -> dict[str, Any]:
        """A copy of the fleet with every running workload's current step count filled in."""
        now = time.time()
        with _state(self.path) as st:
            copy: dict[str, Any] = json.loads(json.dumps(st))
        for node in copy["nodes"].values():
            for workload in node["workloads"].values():
                workload["steps"] = _steps(workload, now)
        return copy


class MemoryExecutor(Executor):
    name = "memory"

    @property
    def path(self) -> str | None:
        return _state_path(self.options)

    @property
    def step_seconds(self) -> float:
        raw = self.options.get("step_seconds", os.environ.get("GPUSWEEP_MEMORY_EXECUTOR_STEP_S", "0"))
        return float(raw)

    # -- plumbing --------------------------------------------------------------------
    def _node(self, st: dict[str, Any], node: NodeRef) -> dict[str, Any]:
        found = st["nodes"].get(node.identity)
        if found is None:
            raise PermanentExecutorError(f"node {node.identity} is not in the memory fleet")
        return found

    def _fault(self, st: dict[str, Any], op: str, node: NodeRef) -> Exception | None:
        """Consume a matching injected fault; the caller raises it after the state is written back."""
        for fault in st["faults"]:
            if fault["op"] == op and fault["node"] in ("*", node.identity) and fault["times"] > 0:
                fault["times"] -= 1
                error = TemporaryExecutorError if fault["kind"] == "temporary" else PermanentExecutorError
                return error(f"injected {fault['kind']} fault in {op} on {node.identity}")
        return None

    def _run(self, op: str, node: NodeRef, operation_id: str, body: Any) -> Any:
        """Run `body(state)` once per operation id; a repeat returns the recorded result."""
        with _state(self.path) as st:
            if operation_id in st["ops"]:
                return st["ops"][operation_id]
            fault = self._fault(st, op, node)
        if fault is not None:
            raise fault
        if self.step_seconds:
            time.sleep(self.step_seconds)
        with _state(self.path) as st:
            if operation_id in st["ops"]:
                return st["ops"][operation_id]
            result = body(st)
            st["ops"][operation_id] = result
            st["log"].append([op, node.identity, operation_id])
            return result

    # -- reads -----------------------------------------------------------------------
    def facts(self, node: NodeRef) -> dict[str, str]:
        with _state(self.path) as st:
            return dict(self._node(st, node)["versions"])

    def list_workloads(self, node: NodeRef) -> list[WorkloadInfo]:
        now = time.time()
        with _state(self.path) as st:
            workloads = self._node(st, node)["workloads"].values()
            return [
                WorkloadInfo(
                    id=w["id"], name=w["name"], gpus=w["gpus"], checkpoint_engine=w["engine"], state=w["state"],
                    steps=_steps(w, now), fingerprint=w["fingerprint"],
                )
                for w in workloads
                if w["state"] == "running"
            ]

    # -- steps -----------------------------------------------------------------------
    def drain(self, node: NodeRef, operation_id: str) -> None:
        def body(st: dict[str, Any]) -> None:
            self._node(st, node)["maintenance"] = True

        self._run("drain", node, operation_id, body)

    def checkpoint(self, node: NodeRef, workload_id: str, engine: str, operation_id: str) -> CheckpointResult:
        def body(st: dict[str, Any]) -> dict[str, Any]:
            data = self._node(st, node)
            workload = data["workloads"].get(workload_id)
            if workload is None or workload["state"] != "running":
                raise PermanentExecutorError(f"workload {workload_id} is not running on {node.identity}")
            steps = _steps(workload, time.time())
            workload.update(state="checkpointed", steps_base=steps)
            st["seq"] += 1
            checkpoint_id = f"ck-{st['seq']}"
            fingerprint = {
                "gpu_model": data["gpu_model"],
                **{c: data["versions"].get(c, "") for c in FINGERPRINT_COMPONENTS},
                **workload["fingerprint"],
            }
            image = json.dumps({"workload": workload, "fingerprint": fingerprint}, sort_keys=True)
            st["checkpoints"][checkpoint_id] = {
                "workload": dict(workload), "fingerprint": fingerprint, "restored_as": None,
                "source": node.identity, "sha256": hashlib.sha256(image.encode()).hexdigest(),
            }
            return {"checkpoint_id": checkpoint_id, "sha256": st["checkpoints"][checkpoint_id]["sha256"],
                    "total_bytes": len(image), "steps": steps, "fingerprint": fingerprint}

        result = self._run("checkpoint", node, operation_id, body)
        return CheckpointResult(
            checkpoint_id=result["checkpoint_id"], sha256=result["sha256"], total_bytes=result["total_bytes"],
            steps=result["steps"], manifest={"fingerprint": result["fingerprint"], "engine": engine},
        )

    def stop(self, node: NodeRef, workload_id: str, operation_id: str) -> None:
        def body(st: dict[str, Any]) -> None:
            workload = self._node(st, node)["workloads"].get(workload_id)
            if workload is not None:
                workload["state"] = "stopped"

        self._run("stop", node, operation_id, body)

    def restore(self, target: NodeRef, checkpoint_id: str, operation_id: str) -> RestoreResult:
        def body(st: dict[str, Any]) -> dict[str, Any]:
            checkpoint = st["checkpoints"].get(checkpoint_id)
            if checkpoint is None:
                raise PermanentExecutorError(f"checkpoint {checkpoint_id} does not exist")
            if checkpoint["restored_as"]:
                # Never two live copies of one workload.
                raise PermanentExecutorError(f"checkpoint {checkpoint_id} was already restored")
            data = self._node(st, target)
            if data["maintenance"]:
                # As the real agent: a node in maintenance admits no work, restores included.
                raise PermanentExecutorError(f"{target.identity} is in maintenance and admits no work")
            here = {"gpu_model": data["gpu_model"], **{c: data["versions"].get(c, "") for c in FINGERPRINT_COMPONENTS}}
            differences = {k: [v, checkpoint["fingerprint"].get(k)] for k, v in here.items()
                           if checkpoint["fingerprint"].get(k) != v}
            if differences:
                raise PermanentExecutorError(f"incompatible restore target {target.identity}: {differences}")
            st["seq"] += 1
            new_id = f"wl-{st['seq']}"
            workload = dict(checkpoint["workload"], id=new_id, state="running", resumed_at=time.time())
            data["workloads"][new_id] = workload
            checkpoint["restored_as"] = f"{target.identity}:{new_id}"
            return {"workload_id": new_id, "steps": workload["steps_base"]}

        result = self._run("restore", target, operation_id, body)
        return RestoreResult(workload_id=result["workload_id"], node=target.identity, steps=result["steps"])

    def patch(self, node: NodeRef, component: str, version: str, operation_id: str) -> PatchResult:
        def body(st: dict[str, Any]) -> dict[str, Any]:
            data = self._node(st, node)
            if not data["maintenance"]:
                raise PermanentExecutorError(f"{node.identity} is not in maintenance; refusing to patch")
            before = data["versions"].get(component, "")
            data["installed"][component] = version
            data["patches"][component] = data["patches"].get(component, 0) + 1
            return {"before": before, "after": version}

        result = self._run("patch", node, operation_id, body)
        return PatchResult(component=component, before=result["before"], after=result["after"], output="memory")

    def reboot(self, node: NodeRef, operation_id: str) -> None:
        def body(st: dict[str, Any]) -> None:
            data = self._node(st, node)
            data["versions"].update(data["installed"])
            data["installed"] = {}
            data["reboots"] += 1

        self._run("reboot", node, operation_id, body)

    def verify(self, node: NodeRef) -> VerifyResult:
        if self.step_seconds:
            time.sleep(self.step_seconds)
        with _state(self.path) as st:
            fault = self._fault(st, "verify", node)
            data = self._node(st, node)
            result = VerifyResult(healthy=data["healthy"], versions=dict(data["versions"]),
                                  output=f"memory: healthy={data['healthy']}")
        if fault is not None:
            raise fault
        return result

    def return_to_service(self, node: NodeRef, operation_id: str) -> None:
        def body(st: dict[str, Any]) -> None:
            self._node(st, node)["maintenance"] = False

        self._run("return", node, operation_id, body)

    def undo(self, node: NodeRef, operation_id: str) -> None:
        def body(st: dict[str, Any]) -> None:
            self._node(st, node)["maintenance"] = False

        self._run("undo", node, operation_id, body)
