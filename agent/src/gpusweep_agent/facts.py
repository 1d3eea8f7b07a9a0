"""Node facts from pluggable probes.

A probe returns a partial facts dict (``gpu_model``, ``gpu_count``, ``product_line``,
``os_family`` and ``components``); probes run in the configured order and later ones override
earlier ones, so a static file listed last pins a test or demo node's facts. A probe whose source
is absent (no NVML, no nvidia-smi, no dpkg) returns nothing rather than failing the agent.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .config import AgentConfig
from .util import host_argv, host_which, import_string

log = logging.getLogger(__name__)

Facts = dict[str, Any]


class Probe:
    name = ""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    def probe(self) -> Facts:
        raise NotImplementedError


class KernelProbe(Probe):
    """Kernel release and OS from uname and /etc/os-release."""

    name = "kernel"

    def probe(self) -> Facts:
        components = {"kernel": platform.release()}  # the node's: a container shares its kernel
        root = Path(self.config.host_root)
        os_release = parse_os_release(root / "etc/os-release")
        if os_release.get("ID"):
            components["os"] = f"{os_release['ID']} {os_release.get('VERSION_ID', '')}".strip()
        return {"os_family": os_family(platform.system(), (root / "etc/nv_tegra_release").exists()),
                "components": components}


def os_family(system: str, tegra: bool) -> str:
    """'linux', 'windows' ... or 'jetson' on a Jetson (Tegra) board: bulletins' Jetson rows are
    not an x86 Linux node's, and their Linux rows not a Jetson's."""
    return "jetson" if tegra and system.lower() == "linux" else system.lower()


def parse_os_release(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    try:
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                values[key.strip()] = value.strip().strip('"')
    except OSError:
        pass
    return values


# Debian/Ubuntu package names of the components bulletins talk about.
PACKAGE_COMPONENTS = {
    "nvidia-container-toolkit": "container_toolkit",
    "datacenter-gpu-manager": "dcgm",
    "datacenter-gpu-manager-4-core": "dcgm",
    "datacenter-gpu-manager-exporter": "dcgm_exporter",
    "nvidia-fabricmanager": "fabric_manager",
    "doca-runtime": "doca",
    "doca-all": "doca",
    "doca-host": "doca",
    "mlnx-ofed-all": "mlnx_ofed",
    "mlnx-ofed-basic": "mlnx_ofed",
    "mlnx-ofed-kernel-utils": "mlnx_ofed",
    "cuda-toolkit": "cuda_toolkit",
}
_CUDA_TOOLKIT_PKG = re.compile(r"^cuda-toolkit-\d+-\d+$")
_FABRIC_RE = re.compile(r"^nvidia-fabricmanager(-\d+)?$")
_DRIVER_RE_PKG = re.compile(r"^nvidia-driver-\d+(-server)?$")


class CheckpointToolsProbe(Probe):
    """The checkpoint tools' versions (`criu --version`; NVIDIA's `cuda-checkpoint --version` where
    installed): an image restores only where the tool that took it has the same version
    (executors.portability's criu rule compares them)."""

    name = "checkpoint_tools"

    def probe(self) -> Facts:
        components = {}
        for component, command in (("criu", self.config.criu), ("cuda_checkpoint", "cuda-checkpoint")):
            version = tool_version(command)
            if version:
                components[component] = version
        return {"components": components} if components else {}


def tool_version(command: str) -> str:
    """The first version number `command --version` prints ("Version: 4.1.1" -> "4.1.1"), or ""."""
    path = shutil.which(command)
    if not path:
        return ""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"\b(\d+(?:\.\d+)+)\b", done.stdout + done.stderr)
    return found.group(1) if found else ""


class PackagesProbe(Probe):
    """Installed component packages through dpkg-query (driver, container toolkit, DCGM, fabric
    manager); on a node configured with the recording package manager (tests), from its database."""

    name = "packages"

    def probe(self) -> Facts:
        if self.config.package_manager == "recording" and self.config.package_db:
            from .packages import RecordingPackageManager

            installed = RecordingPackageManager(Path(self.config.package_db)).installed()
            return {"components": components_of(installed)}
        if not host_which(self.config, "dpkg-query"):
            return {}
        out = subprocess.run(
            host_argv(self.config, ["dpkg-query", "-W", "-f", "${Package}\\t${Version}\\t${db:Status-Status}\\n"]),
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout
        return {"components": parse_dpkg_query(out)} if out else {}


def parse_dpkg_query(output: str) -> dict[str, str]:
    installed = {}
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2] == "installed":
            installed[parts[0].split(":")[0]] = parts[1]
    return components_of(installed)


def components_of(installed: dict[str, str]) -> dict[str, str]:
    """Component versions from installed packages (name -> Debian version)."""
    components: dict[str, str] = {}
    for package, version in installed.items():
        # Debian versions carry epoch and revision; bulletins speak upstream versions.
        upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
        name = PACKAGE_COMPONENTS.get(package) or ("fabric_manager" if _FABRIC_RE.match(package) else None) or (
            "driver" if _DRIVER_RE_PKG.match(package) else None) or (
            "cuda_toolkit" if _CUDA_TOOLKIT_PKG.match(package) else None)
        if name:
            components[name] = upstream
    return components


class NvidiaSmiProbe(Probe):
    """GPU model, count, driver and CUDA version from `nvidia-smi`'s own output."""

    name = "nvidia_smi"
    command = "nvidia-smi"

    def probe(self) -> Facts:
        if not shutil.which(self.command):
            return {}
        try:
            query = subprocess.run(
                [self.command, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=True,
            ).stdout
            banner = subprocess.run([self.command], capture_output=True, text=True, timeout=30, check=False).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("nvidia-smi probe failed: %s", exc)
            return {}
        return parse_nvidia_smi(query, banner)


_CUDA_RE = re.compile(r"CUDA Version:\s*([0-9.]+)")
_DRIVER_RE = re.compile(r"Driver Version:\s*([0-9.]+)")


def parse_nvidia_smi(query_csv: str, banner: str = "") -> Facts:
    """Facts from `nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` and the banner."""
    rows = [[c.strip() for c in line.split(",")] for line in query_csv.splitlines() if line.strip()]
    facts: Facts = {"components": {}}
    if rows:
        facts["gpu_model"] = rows[0][0]
        facts["gpu_count"] = len(rows)
        facts["product_line"] = product_line(rows[0][0])
        if len(rows[0]) > 1 and rows[0][1]:
            facts["components"]["driver"] = rows[0][1]
    if match := _CUDA_RE.search(banner):
        facts["components"]["cuda"] = match.group(1)
    if "driver" not in facts["components"] and (match := _DRIVER_RE.search(banner)):
        facts["components"]["driver"] = match.group(1)
    return facts


def product_line(model: str) -> str:
    lowered = model.lower()
    if "geforce" in lowered or "titan" in lowered:
        return "geforce"
    if "rtx" in lowered or "quadro" in lowered:
        return "rtx"
    return "tesla"


class NvmlProbe(Probe):
    """GPU model, count, driver and CUDA driver version through nvidia-ml-py (optional)."""

    name = "nvml"

    def probe(self) -> Facts:
        try:
            import pynvml
        except ImportError:
            return {}
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError has many subclasses; any means "no NVML here"
            log.info("NVML unavailable: %s", exc)
            return {}
        try:
            count = pynvml.nvmlDeviceGetCount()
            facts: Facts = {"gpu_count": count, "components": {}}
            if count:
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
                facts["gpu_model"] = name.decode() if isinstance(name, bytes) else name
                facts["product_line"] = product_line(facts["gpu_model"])
            driver = pynvml.nvmlSystemGetDriverVersion()
            facts["components"]["driver"] = driver.decode() if isinstance(driver, bytes) else driver
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            facts["components"]["cuda"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
            return facts
        finally:
            pynvml.nvmlShutdown()


class StaticProbe(Probe):
    """Facts from a JSON file (test and demo nodes); a simulated patch and reboot rewrite it."""

    name = "static"

    def probe(self) -> Facts:
        if not self.config.static_facts:
            return {}
        path = Path(self.config.static_facts)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ProbeError(f"static facts file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ProbeError(f"static facts file {path}: expected a JSON object")
        return data


# Python distributions (pip metadata) of the components bulletins talk about.
PIP_COMPONENTS = {"nemo-toolkit": "nemo", "nemo_toolkit": "nemo", "tensorrt-llm": "tensorrt_llm",
                  "tensorrt_llm": "tensorrt_llm", "ai-dynamo": "dynamo", "ai_dynamo": "dynamo"}
PIP_PATHS = ["/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
             "/usr/lib/python3/dist-packages", "/opt/conda/lib/python3*/site-packages"]


class PipProbe(Probe):
    """NeMo, TensorRT-LLM and Dynamo from the pip metadata of the system's Python installs."""

    name = "pip"

    def probe(self) -> Facts:
        from glob import glob
        from importlib import metadata

        paths = [p for pattern in PIP_PATHS for p in sorted(glob(pattern))]
        found = {str(d.metadata["Name"] or ""): d.version for d in metadata.distributions(path=paths)} if paths else {}
        components = pip_components(found)
        return {"components": components} if components else {}


def pip_components(distributions: dict[str, str]) -> dict[str, str]:
    """Component versions from installed distributions (name -> version, as pip reports them)."""
    return {PIP_COMPONENTS[name.lower()]: version for name, version in sorted(distributions.items())
            if name.lower() in PIP_COMPONENTS}


# Container images (NGC names) of the components bulletins talk about: image -> (component, which
# dotted group of the tag is its version: dcgm-exporter tags are "<DCGM>-<exporter>-<OS>").
IMAGE_COMPONENTS = {"tritonserver": ("triton", 0), "dcgm-exporter": ("dcgm_exporter", -1), "nemo": ("nemo", 0),
                    "dynamo": ("dynamo", 0), "tensorrt-llm": ("tensorrt_llm", 0)}
_TAG_VERSION = re.compile(r"v?(\d+(?:\.\d+)+(?:rc\d+)?)")


class ImagesProbe(Probe):
    """Triton, DCGM Exporter, NeMo, Dynamo and TensorRT-LLM from the container images on the node
    (crictl, else docker)."""

    name = "images"

    def probe(self) -> Facts:
        for argv in (["crictl", "images", "-o", "json"], ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"]):
            if not shutil.which(argv[0]):
                continue
            try:
                out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            refs = _image_refs(out)
            components = image_components(refs)
            return {"components": components} if components else {}
        return {}


def _image_refs(output: str) -> list[str]:
    try:
        data = json.loads(output)
    except ValueError:
        return [line.strip() for line in output.splitlines() if line.strip()]
    return [str(tag) for image in (data.get("images") or []) if isinstance(image, dict)
            for tag in image.get("repoTags") or []]


def image_components(refs: list[str]) -> dict[str, str]:
    """Component versions from image references ('nvcr.io/nvidia/tritonserver:24.11-py3' -> triton
    24.11). Of several tags the oldest wins: any image on the node can be started."""
    found: dict[str, list[str]] = {}
    for ref in refs:
        repository, _sep, tag = ref.rpartition(":")
        entry = IMAGE_COMPONENTS.get(repository.rsplit("/", 1)[-1])
        versions = _TAG_VERSION.findall(re.sub(r"-(?:ubuntu|ubi|rhel|centos|distroless|py)[\w.-]*$", "", tag))
        if entry and versions:
            found.setdefault(entry[0], []).append(versions[entry[1]] if len(versions) > abs(entry[1]) else versions[0])
    return {name: min(versions, key=lambda v: [int(p) for p in re.findall(r"\d+", v)])
            for name, versions in sorted(found.items())}


class ProbeError(Exception):
    """A configured probe's source is present but unreadable."""


PROBES = {
    "kernel": "gpusweep_agent.facts.KernelProbe",
    "checkpoint_tools": "gpusweep_agent.facts.CheckpointToolsProbe",
    "packages": "gpusweep_agent.facts.PackagesProbe",
    "nvidia_smi": "gpusweep_agent.facts.NvidiaSmiProbe",
    "nvml": "gpusweep_agent.facts.NvmlProbe",
    "pip": "gpusweep_agent.facts.PipProbe",
    "images": "gpusweep_agent.facts.ImagesProbe",
    "static": "gpusweep_agent.facts.StaticProbe",
    "livepatch": "gpusweep_agent.osinfo.LivepatchProbe",
}


def load_probe(name: str, config: AgentConfig) -> Probe:
    cls = import_string(PROBES.get(name, name))
    if not (isinstance(cls, type) and issubclass(cls, Probe)):
        raise ProbeError(f"probe {name!r} is not a Probe class")
    return cls(config)


def merge(base: Facts, extra: Facts) -> Facts:
    merged = {**base, **{k: v for k, v in extra.items() if k != "components"}}
    merged["components"] = {**base.get("components", {}), **extra.get("components", {})}
    return merged


def gather(config: AgentConfig) -> Facts:
    facts: Facts = {"gpu_model": "", "gpu_count": 0, "product_line": "tesla", "os_family": "linux", "components": {}}
    probes = list(config.probes)
    if config.static_facts and "static" not in probes:
        probes.append("static")
    for name in probes:
        facts = merge(facts, load_probe(name, config).probe())
    return facts
