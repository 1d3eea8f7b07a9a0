"""Every GPU visible, each with the expected driver.

Read through NVML (libnvidia-ml, by ctypes: nvmlInit_v2, nvmlDeviceGetCount_v2,
nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlSystemGetDriverVersion),
else `nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader`. Both are
written against NVIDIA's documented interfaces and tested here only on recorded output
(agent/tests/data): no GPU has run them on this project's machines.

Options (``health_options.gpus``): ``libnvidia_ml`` (``libnvidia-ml.so.1``; "" disables NVML),
``nvidia_smi`` (``nvidia-smi``), ``timeout`` (60 s).
"""

from __future__ import annotations

import ctypes
import shutil
from dataclasses import dataclass
from typing import Any

from .base import FAILED, PASSED, SKIPPED, CheckResult, HealthCheck, HealthRequest, run_command

NVML_SUCCESS = 0
QUERY = "--query-gpu=index,uuid,name,driver_version"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    driver: str


class GpuReadError(Exception):
    """The GPU source is present but did not answer."""


def parse_gpu_query(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            raise GpuReadError(f"unexpected nvidia-smi line {line!r}")
        gpus.append(Gpu(int(parts[0]), parts[1], parts[2], parts[3]))
    return gpus


def read_nvml(library: str) -> list[Gpu] | None:
    """The GPUs through NVML; None when the library is not on this node."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return None

    def check(code: int, call: str) -> None:
        if code != NVML_SUCCESS:
            raise GpuReadError(f"NVML {call} returned {code}")

    check(nvml.nvmlInit_v2(), "nvmlInit_v2")
    try:
        count = ctypes.c_uint(0)
        check(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        driver = ctypes.create_string_buffer(80)
        check(nvml.nvmlSystemGetDriverVersion(driver, 80), "nvmlSystemGetDriverVersion")
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            check(nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex_v2")
            name, uuid = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
            check(nvml.nvmlDeviceGetName(handle, name, 96), "nvmlDeviceGetName")
            check(nvml.nvmlDeviceGetUUID(handle, uuid, 96), "nvmlDeviceGetUUID")
            gpus.append(Gpu(index, uuid.value.decode(), name.value.decode(), driver.value.decode()))
        return gpus
    finally:
        nvml.nvmlShutdown()


def evaluate(gpus: list[Gpu], want_driver: str, want_count: int) -> tuple[bool, str, dict[str, Any]]:
    """(healthy, summary, detail): as many GPUs as expected, each on the expected driver."""
    wrong = [g for g in gpus if want_driver and g.driver != want_driver]
    problems = []
    if want_count and len(gpus) != want_count:
        problems.append(f"{len(gpus)} of {want_count} GPUs visible")
    if wrong:
        problems.append(", ".join(f"GPU {g.index} ({g.uuid}) on driver {g.driver}" for g in wrong)
                        + f" instead of {want_driver}")
    detail = {"visible": len(gpus), "expected": want_count, "driver": want_driver,
              "gpus": [{"index": g.index, "uuid": g.uuid, "name": g.name, "driver": g.driver} for g in gpus]}
    if problems:
        return False, "; ".join(problems), detail
    return True, f"{len(gpus)} GPUs visible on driver {want_driver or '(any)'}", detail


class GpusCheck(HealthCheck):
    name = "gpus"

    def read(self) -> tuple[str, list[Gpu] | None, str]:
        """(source, GPUs or None when no source is present, raw output)."""
        library = str(self.options.get("libnvidia_ml", "libnvidia-ml.so.1"))
        if library:
            gpus = read_nvml(library)
            if gpus is not None:
                return "nvml", gpus, ""
        smi = shutil.which(str(self.options.get("nvidia_smi", "nvidia-smi")))
        if not smi:
            return "", None, ""
        code, output = run_command([smi, QUERY, "--format=csv,noheader"], float(self.options.get("timeout", 60)))
        if code != 0:
            raise GpuReadError(f"nvidia-smi exited {code}: {output[-2000:]}")
        return "nvidia-smi", parse_gpu_query(output), output

    def run(self, request: HealthRequest, facts: dict[str, Any]) -> list[CheckResult]:
        want_driver = request.expected.get("driver") or str((facts.get("components") or {}).get("driver", ""))
        want_count = request.gpu_count or int(facts.get("gpu_count") or 0)
        try:
            source, gpus, output = self.read()
        except GpuReadError as exc:
            return [CheckResult(self.name, FAILED, str(exc)[:500], str(exc))]
        if gpus is None:
            return [CheckResult(self.name, SKIPPED, "neither NVML nor nvidia-smi is on this node")]
        healthy, summary, detail = evaluate(gpus, want_driver, want_count)
        return [CheckResult(self.name, PASSED if healthy else FAILED, f"{source}: {summary}", output,
                            {**detail, "source": source})]
