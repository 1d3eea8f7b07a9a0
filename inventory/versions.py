"""Component versions in comparable form.

Each version is stored raw and, when it parses, as a sort key: every numeric field zero-padded
to 8 digits and joined by dots. The key compares as text in the same order as the versions
compare field by field (570.9 < 570.86.15 < 570.195.03), so range tests run in the database
as plain string comparisons, set-based. A version that does not parse keeps key None and is
flagged, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIELD_WIDTH = 8

# Known components. Others are accepted as free text (no migration per component) and parsed
# with the generic rule.
DRIVER = "driver"
KNOWN_COMPONENTS = {
    DRIVER: "NVIDIA driver",
    "cuda": "CUDA",
    "kernel": "Linux kernel",
    "os": "Operating system",
    "container_toolkit": "NVIDIA Container Toolkit",
    "gpu_operator": "NVIDIA GPU Operator",
    "dcgm": "DCGM",
    "fabric_manager": "Fabric Manager",
    "triton": "Triton Inference Server",
    "vllm": "vLLM",
    "cuda_toolkit": "CUDA Toolkit",
    "vbios": "VBIOS",
    "system_firmware": "System firmware (by platform)",
    "bmc": "BMC firmware (by platform)",
    "nvswitch_firmware": "NVSwitch / NVLink firmware",
    "tensorrt_llm": "TensorRT-LLM",
    "nim": "NVIDIA NIM",
    "base_command_manager": "Base Command Manager",
    "firmware": "Firmware (unscoped: prefer vbios, system_firmware or bmc)",
}

# Node facts (Node.facts) that advisories match besides versions, with the values they take.
# Others are accepted as free text, like components; values are stored lower-case.
KNOWN_FACTS = {
    "gpu_architecture": "GPU architecture (maxwell, pascal, volta, turing, ampere, ada, hopper, blackwell)",
    "platform": "System platform (dgx_a100, dgx_h100, hgx_h100 ...)",
    "container_toolkit_mode": "NVIDIA Container Toolkit mode (legacy, cdi, csv)",
}
_FACT_VALUE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")


def normalize_fact(name: str, value: str) -> tuple[str, str]:
    """('Platform', 'DGX A100') -> ('platform', 'dgx_a100'); VersionError when either is not usable."""
    key = normalize_component(name)
    cleaned = re.sub(r"[\s/]+", "_", value.strip().lower())
    if not _FACT_VALUE.match(cleaned):
        raise VersionError(f"fact {key} {value!r} is not a short name (letters, digits, _ . -)")
    return key, cleaned


_DRIVER = re.compile(r"^(\d{2,4})(?:\.(\d{1,4})){1,3}$")
# Generic: leading dotted numbers, then an optional tail (-1ubuntu1, +cuda12, rc1, -amd64...).
_GENERIC = re.compile(r"^[vV]?(\d+(?:\.\d+)*)(?:[-+~_.]?[0-9A-Za-z.+~_-]*)?$")
_COMPONENT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


class VersionError(ValueError):
    pass


@dataclass(frozen=True)
class ParsedVersion:
    raw: str
    key: str | None
    branch: str

    @property
    def flagged(self) -> bool:
        """True when the version did not parse: stored raw, never compared."""
        return self.key is None

    @property
    def fields(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.key.split(".")) if self.key else ()


def sort_key(fields: tuple[int, ...] | list[int]) -> str:
    for number in fields:
        if number < 0 or number >= 10**FIELD_WIDTH:
            raise VersionError(f"version field {number} out of range")
    return ".".join(str(number).zfill(FIELD_WIDTH) for number in fields)


def normalize_component(name: str) -> str:
    cleaned = name.strip().lower().replace("-", "_").replace(" ", "_")
    if not _COMPONENT_NAME.match(cleaned):
        raise VersionError(f"component name {name!r} is not a lower-case identifier")
    return cleaned


def parse_version(component: str, raw: str) -> ParsedVersion:
    """Parse `raw` for `component`; unknown formats come back flagged (key None)."""
    text = raw.strip()
    if not text:
        raise VersionError(f"empty version for {component}")
    if len(text) > 128:
        raise VersionError(f"version for {component} is longer than 128 characters")
    if component == DRIVER:
        match = _DRIVER.match(text)
        if not match:
            return ParsedVersion(raw=text, key=None, branch="")
        fields = tuple(int(part) for part in text.split("."))
        return ParsedVersion(raw=text, key=sort_key(fields), branch=f"R{fields[0]}")
    match = _GENERIC.match(text)
    if not match:
        return ParsedVersion(raw=text, key=None, branch="")
    fields = tuple(int(part) for part in match.group(1).split("."))
    if len(fields) > 12 or any(number >= 10**FIELD_WIDTH for number in fields):
        return ParsedVersion(raw=text, key=None, branch="")
    return ParsedVersion(raw=text, key=sort_key(fields), branch="")


def driver_branch(raw: str) -> str:
    """'R570' for '570.86.15'; '' when the driver version does not parse."""
    return parse_version(DRIVER, raw).branch
