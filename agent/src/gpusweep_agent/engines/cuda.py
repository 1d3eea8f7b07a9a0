"""The `cuda` engine: GPU state through the CUDA driver's checkpoint API, then CRIU.

The driver (since 570 / CUDA 12.8) can lock a process's CUDA calls, move its device memory into
host memory, and later put it back: cuCheckpointProcessLock / Checkpoint / Restore / Unlock.
With the GPU state in host memory, CRIU dumps the process like any other. Restore runs CRIU, then
Restore and Unlock. libcuda is loaded with ctypes, so the agent has no CUDA dependency.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from ..config import AgentConfig
from .base import EngineError, EngineUnavailable, Progress
from .criu import CriuEngine

CUDA_SUCCESS = 0
PROCESS_STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class _Reserved8(ctypes.Structure):
    # CUcheckpointCheckpointArgs and CUcheckpointUnlockArgs: reserved words only.
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class _RestoreArgs(ctypes.Structure):
    _fields_ = [("gpuPairs", ctypes.c_void_p), ("gpuPairsCount", ctypes.c_uint),
                ("reserved", ctypes.c_char * (44 - ctypes.sizeof(ctypes.c_void_p))), ("reserved1", ctypes.c_uint64)]


class CudaCheckpoint:
    """The driver's checkpoint calls for one library (the real libcuda, or a stand-in in tests)."""

    def __init__(self, library: str) -> None:
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise EngineUnavailable(f"cannot load {library}: {exc} (the cuda engine needs driver 570+)") from None
        for name in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                     "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState"):
            if not hasattr(self.lib, name):
                raise EngineUnavailable(f"{library} has no {name}: the driver predates 570 / CUDA 12.8")
        if hasattr(self.lib, "cuInit"):
            self._call("cuInit", ctypes.c_uint(0))

    def _call(self, name: str, *args: Any) -> None:
        fn = getattr(self.lib, name)
        fn.restype = ctypes.c_int
        result = fn(*args)
        if result != CUDA_SUCCESS:
            raise EngineError(f"{name} failed with CUresult {result}")

    def state(self, pid: int) -> str:
        value = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", ctypes.c_int(pid), ctypes.byref(value))
        return PROCESS_STATES.get(value.value, f"unknown({value.value})")

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = _LockArgs(timeoutMs=timeout_ms)
        self._call("cuCheckpointProcessLock", ctypes.c_int(pid), ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", ctypes.c_int(pid), ctypes.byref(_Reserved8()))

    def restore(self, pid: int) -> None:
        self._call("cuCheckpointProcessRestore", ctypes.c_int(pid), ctypes.byref(_RestoreArgs()))

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", ctypes.c_int(pid), ctypes.byref(_Reserved8()))


class CudaEngine(CriuEngine):
    name = "cuda"
    lock_timeout_ms = 30_000
    # The GPU's memory reaches host memory only at the dump (before_dump): pre-dumps would copy the rest twice.
    pre_dumps = False

    def __init__(self, config: AgentConfig) -> None:
        super().__init__(config)
        self._cuda: CudaCheckpoint | None = None

    @property
    def cuda(self) -> CudaCheckpoint:
        if self._cuda is None:
            self._cuda = CudaCheckpoint(self.config.libcuda)
        return self._cuda

    def check(self) -> None:
        super().check()
        _ = self.cuda

    def before_dump(self, pid: int, progress: Progress) -> dict[str, Any]:
        self.cuda.lock(pid, self.lock_timeout_ms)
        progress(cuda_state="locked")
        try:
            self.cuda.checkpoint(pid)
        except EngineError:
            self.cuda.unlock(pid)
            raise
        progress(cuda_state="checkpointed")
        return {"cuda": True}

    def after_dump(self, pid: int, leave_running: bool, ok: bool) -> None:
        # The process lives on (left running, or CRIU failed and thawed it): give it its GPU back.
        if leave_running or not ok:
            self.cuda.restore(pid)
            self.cuda.unlock(pid)

    def after_restore(self, pid: int, engine_data: dict[str, Any]) -> None:
        self.cuda.restore(pid)
        self.cuda.unlock(pid)

    def recover(self, workload: dict[str, Any], image_dir: Path, state: dict[str, Any]) -> bool:
        complete = super().recover(workload, image_dir, state)
        pid = int(workload.get("pid") or 0)
        if not complete and state.get("cuda_state") in ("locked", "checkpointed"):
            # The dump did not finish and the process still runs locked: release it.
            try:
                if self.cuda.state(pid) == "checkpointed":
                    self.cuda.restore(pid)
                if self.cuda.state(pid) == "locked":
                    self.cuda.unlock(pid)
            except EngineError:
                pass
        return complete
