"""Component versions in comparable form.

Each version is stored raw and, when it parses, as a sort key: every numeric field zero-padded
to 8 digits and joined by dots. The key compares as text in the same order as the versions
compare field by field (570.9 < 570.86.15 < 570.195.03), so range tests run in the database
as plain string comparisons, set-based. A version that does not parse keeps key None and is
flagged, never guessed.

What follows the numbers orders too, in the same text comparison (see `_suffix_key`):
pre-releases before their release (PEP 440's rules, through `packaging`: 1.3.0rc17 < 1.3.0),
a letter suffix after it (10.24.09 < 10.24.09a < 10.24.09b < 10.24.10), "Update N" / "uN" as
the next field (CUDA's "12.6 Update 2" is 12.6.2), a post-release just after its release.
Other tails (Debian revisions, "-amd64", "+cuda12") are not part of the order, as before.
The keys hold digits, lower-case letters and dots only, so every database collation orders them
as plain text does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

FIELD_WIDTH = 8

# Known components. Others are accepted as free text (no migration per component) and parsed
# with the generic rule.
DRIVER = "driver"
# A kernel livepatch as a component: its "version" is the applied livepatch's (canonical-livepatch's
# number), which a later one includes; a campaign applies it with no drain and no reboot.
LIVEPATCH = "livepatch"
# A distribution's package update in place (packages that are neither the kernel nor the driver): its
# "version" names the exact set of package versions a campaign installs (advisories.osplan); no drain,
# no reboot. The agent's read-back of the installed versions is its check.
OS_PACKAGES = "packages"
KNOWN_COMPONENTS = {
    DRIVER: "NVIDIA driver",
    "cuda": "CUDA",
    "kernel": "Linux kernel",
    LIVEPATCH: "Kernel livepatch (the applied livepatch's version)",
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
    "nemo": "NVIDIA NeMo",
    "doca": "NVIDIA DOCA",
    "mlnx_ofed": "MLNX_OFED",
    "dynamo": "NVIDIA Dynamo",
    "dcgm_exporter": "DCGM Exporter",
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
_GENERIC = re.compile(r"^[vV]?(\d+(?:\.\d+)*)((?:[-+~_. ]?[0-9A-Za-z.+~_ -]*)?)$")
# Tails that order (the rest is ignored): "Update 2" / "U1", a PEP 440 pre-, post- or
# dev-release ("rc17", "-rc.1", " beta 2", "a1", ".post1", ".dev3"), a lone letter ("a").
_UPDATE = re.compile(r"[ ._-]*(?:update|u)[ ._-]*(\d+)", re.I)
_PEP440 = re.compile(r"[ ._~-]*((?:alpha|beta|preview|pre|rc|c|a|b)[ ._-]*\d*|(?:post|dev)[ ._-]*\d*)"
                     r"(?:[ ._-]*(?:post|dev)[ ._-]*\d*)*", re.I)
_LETTER = re.compile(r"[a-z]", re.I)
# A second dotted part after a hyphen (MLNX_OFED "24.10-1.1.4.0", DCGM Exporter "4.1.1-4.0.4"),
# not a Debian revision or an architecture ("-1", "-27-amd64").
_COMPOUND = re.compile(r"-(\d+(?:\.\d+)+)(?=$|[-+~_. ])")
FIELD_MAX = 10**FIELD_WIDTH - 1
# Pre-release phases in PEP 440's order, as one character each (digits sort before letters).
_PHASES = {"dev": "1", "a": "a", "b": "b", "rc": "c"}
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
        """The release numbers (the key may carry a suffix or a borrowed field, see `_suffix_key`)."""
        match = re.match(r"[vV]?(\d+(?:\.\d+)*)", self.raw) if self.key else None
        return tuple(int(part) for part in match.group(1).split(".")) if match else ()


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
    return ParsedVersion(raw=text, key=_suffix_key(fields, match.group(2)), branch="")


def _suffix_key(fields: tuple[int, ...], tail: str) -> str | None:
    """The key of `fields` followed by `tail`, ordered as the module docstring says.

    A key can only grow after its release's key, so a pre-release borrows: 1.3.2rc1 is keyed as
    1.3.1 followed by ".z" and its phase, above every 1.3.1.x and below 1.3.2 (1.3.0rc1 borrows
    through the zero: 1.2.99999999.z...). Post-releases are two more fields (0, N), between X and
    X.1 as PEP 440 has them; a letter suffix ".s<letter>" follows every X.y.
    """
    if m := _COMPOUND.match(tail):  # "24.10-1.1.4.0": one version in two parts, both ordered
        fields, tail = (*fields, *(int(p) for p in m.group(1).split("."))), tail[m.end():]
        if len(fields) > 12 or any(number > FIELD_MAX for number in fields):
            return None
    if not tail:
        return sort_key(fields)
    if m := _UPDATE.fullmatch(tail):
        return sort_key((*fields, int(m.group(1))))
    if _LETTER.fullmatch(tail):
        return sort_key(fields) + ".s" + tail.lower()
    if not _PEP440.fullmatch(tail):
        return sort_key(fields)  # a tail that does not order (Debian revision, arch, local)
    try:
        version = Version(".".join(map(str, fields)) + re.sub(r"[ ~]", "", tail))
    except InvalidVersion:
        return sort_key(fields)
    if version.pre is None and version.dev is None:
        return sort_key((*fields, 0, version.post or 0))
    phase, number = version.pre if version.pre is not None else ("dev", version.dev or 0)
    borrowed = list(fields)
    i = len(borrowed) - 1
    while i >= 0 and borrowed[i] == 0:
        borrowed[i] = FIELD_MAX
        i -= 1
    if i < 0:
        return None  # 0.0rc1: nothing below it to borrow from
    borrowed[i] -= 1
    return sort_key(borrowed) + ".z" + _PHASES[phase] + str(number).zfill(FIELD_WIDTH)


def driver_branch(raw: str) -> str:
    """'R570' for '570.86.15'; '' when the driver version does not parse."""
    return parse_version(DRIVER, raw).branch
