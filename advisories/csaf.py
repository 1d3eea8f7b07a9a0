"""CSAF 2.0 documents as NVIDIA publishes them, decoded into plain data (no Django).

NVIDIA encodes affected ranges in the product tree rather than in CSAF's version ranges:

    vendor NVIDIA
      product_family
        product_name  "Tesla"   linuxr580_tesla
      architecture   "Linux(R580)"
        product_version "Tesla" linuxr580_tesla_all_driver_versions_prior_to_580_95_05   (affected)
        product_version "Tesla" linuxr580_tesla_580_95_05                                 (fixed)

The architecture gives the OS and driver branch, the leaf's name the product (a component of
`advisories.components`), and the version text (the CPE's version field, or the product_id minus
the product_name's id) the range; `GRAMMAR` lists every form decoded. Each vulnerability's
`product_status` names the leaves it applies to, so which CVEs hit which row is read per range,
and a plain version listed as `known_affected` is that affected release itself.

Nothing is dropped silently. Every row that does not decode, every product no component maps
to, and every driver branch the bulletin skips while naming older and newer ones comes back as
a `ReviewNote` (the advisory needs review), and where a node could still be hit (a known
component whose row did not decode; a skipped branch) as a range with `basis` other than
"decoded": nodes inside it are *presumed* exposed, never taken for safe.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import pairwise
from typing import Any

from advisories import components
from advisories.choices import RangeBasis, ReviewKind, Severity
from inventory.versions import VersionError, parse_version, sort_key


class DocumentError(ValueError):
    """A document that cannot be ingested; the message names the document and the problem."""

    def __init__(self, document: str, problem: str) -> None:
        super().__init__(f"{document}: {problem}")
        self.document = document
        self.problem = problem


@dataclass(frozen=True)
class ParsedCVE:
    cve_id: str
    title: str
    description: str
    cvss_vector: str
    base_score: float | None
    severity: str
    cwe_id: str
    cwe_name: str
    release_date: datetime | None
    affected_product_ids: tuple[str, ...]
    fixed_product_ids: tuple[str, ...]


@dataclass(frozen=True)
class ParsedRange:
    product_id: str
    product_name: str
    component: str
    os_family: str  # linux, windows, hypervisor, or "" (any)
    branch: str  # "R580" or ""
    product_line: str  # tesla, geforce, rtx_quadro, studio, vgpu_guest, vgpu_manager, cloud_gaming, ""
    architecture: str
    raw: str  # the version text as NVIDIA wrote it
    lower: str | None  # versions as dotted text ("580.95.05"); None = unbounded
    lower_inclusive: bool
    upper: str | None
    upper_inclusive: bool
    fixed_version: str
    fixed_product_id: str
    cve_ids: tuple[str, ...]
    basis: str = RangeBasis.DECODED
    scope: dict[str, str] = field(default_factory=dict)  # {"gpu_model": "h100"} / {"platform": "dgx_a100"}
    condition: dict[str, list[str]] = field(default_factory=dict)  # {"container_toolkit_mode": ["cdi"]}
    remediation: str = ""


@dataclass(frozen=True)
class ReviewNote:
    """Something in a bulletin that could not be decoded or mapped: the advisory needs review."""

    key: str  # product_id, or a synthetic key ("unsupported_branch:R535-R570")
    kind: str  # ReviewKind
    raw: str
    reason: str
    component: str = ""  # the component it would map to, when known

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "kind": self.kind, "raw": self.raw, "reason": self.reason,
                "component": self.component}


@dataclass
class ParsedAdvisory:
    publisher: str
    publisher_id: str
    title: str
    tracking_version: str
    status: str
    initial_release_date: datetime
    current_release_date: datetime
    revision_history: list[dict[str, str]]
    severity: str
    summary: str
    content_sha256: str
    cves: list[ParsedCVE] = field(default_factory=list)
    ranges: list[ParsedRange] = field(default_factory=list)
    review: list[ReviewNote] = field(default_factory=list)
    rows: dict[str, str] = field(default_factory=dict)  # every product row: product_id -> its name (text)
    read_rows: set[str] = field(default_factory=set)  # the rows whose version text decoded


# --- helpers ------------------------------------------------------------------------------


def _req(obj: Any, key: str, kind: type | tuple[type, ...], doc: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise DocumentError(doc, f"{where} is not an object")
    if key not in obj:
        raise DocumentError(doc, f"required field {where}.{key} is missing")
    value = obj[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DocumentError(doc, f"{where}.{key} should be {names}, got {type(value).__name__}")
    return value


def _opt(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], doc: str, where: str) -> Any:
    if key not in obj or obj[key] is None:
        return None
    return _req(obj, key, kind, doc, where)


def _date(text: str, doc: str, where: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise DocumentError(doc, f"{where} is not an ISO 8601 date: {text!r}") from None


# CSAF 2.0 version_t: integer versioning or semantic versioning (section 3.1.11).
_INTEGER_VERSION = re.compile(r"(0|[1-9][0-9]*)")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?"
)


def is_version(text: str) -> bool:
    return bool(_INTEGER_VERSION.fullmatch(text) or _SEMVER.fullmatch(text))


def version_tuple(text: str) -> tuple[Any, ...]:
    """Order of CSAF tracking versions: '1.10.0' > '1.9.0'; a pre-release sorts before its release.

    Only for texts `is_version` accepts (ingest validates them first); anything else sorts first.
    """
    if m := _SEMVER.fullmatch(text):
        core = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        pre = m.group(4)
        # (1,) after every pre-release: 1.0.0-rc.1 < 1.0.0.
        tail: tuple[Any, ...] = (1,) if pre is None else (0, *((0, int(p)) if p.isdigit() else (1, p)
                                                              for p in pre.split(".")))
        return (*core, *tail)
    if _INTEGER_VERSION.fullmatch(text):
        return (int(text),)
    return (-1,)


# --- version text decoding ------------------------------------------------------------------

# A version: dotted (or, in product ids, underscored) numbers, then a pre-release ("rc17",
# "-rc.1", "beta2"), an update ("_update_2", "u1") or a letter suffix ("10.24.09a"); `_canon`
# writes it the way inventory/versions.py orders it.
_SUFFIX = r"(?:_?(?:update_?|u)\d+|[-_.]?(?:rc|alpha|beta|pre|dev)[._]?\d+|[ab]\d+|[a-z](?![a-z0-9]))"
# A compound version ("24.10-1.1.4.0", MLNX_OFED; "4.1.1-4.0.4", DCGM Exporter) is one version;
# "0.0-26.05" alone is a range (see "X to Y").
# A release channel after it ("2.9.1 LTS", "24.10-1.1.4.0-LTS") is not part of the version.
_V = rf"[vr]?(\d+(?:[._]\d+)*(?:-\d+(?:\.\d+)+)?(?:\.x)?{_SUFFIX}?)(?:[_-](?:lts|ga|gm)(?![a-z0-9]))?"
_ALL = r"(?:all_)?(?:(?:drivers?|software|product)_)?(?:versions?|releases?)"
# Words naming the product inside a version text ("prior to CUDA Toolkit v12.2"): not a month,
# not a word of the grammar.
_WORDS = (r"(?:(?!(?:the|all|and|or|to|prior|before|up|including|versions?|releases?|from|after|starting|than"
          r"|later|newer|through|until|january|february|march|april|may|june|july|august|september|october"
          r"|november|december)_)[a-z][a-z-]*_){1,4}")
_LABEL = r"all_versions_(?:prior_to_and_including|up_to_and_including)_(?:(?!all_versions)[a-z0-9_.,])+"
_RELEASE = r"(?:the_)?[a-z]+_\d{4}(?:_cloud_gaming)?_release"

# Two bounds in one text, the lower ("from X", "X and later", "later than X"; by then ">= X" reads
# "X or newer" and "> X" "later than X") and the upper ("prior to Y", "before Y"), in either order,
# joined by a comma or "and" ("X and later, prior to Y"; ">= X, < Y"; "< Y, >= X"). "Up to Y",
# "through Y" and "until Y" include Y, as "All versions up to Y" does above and as in English
# ("up to 5" counts 5): "X up to Y" is [X, Y], "from X prior to Y" [X, Y).
_LO, _HI = (_V.replace("(", f"(?P<{name}>", 1) for name in ("lo", "hi"))
_LOWER_EXCLUSIVE = r"(?:later|newer|greater|higher)_than|after"
_LATER = r"(?:and|or)_(?:later|newer|above|higher|greater)(?:_versions?|_releases?)?"
_UPPER_INCLUSIVE = ("prior_to_and_including", "up_to_and_including", "up_to", "through", "until")
_UPPER = (rf"(?P<uw>prior_to_and_including|up_to_and_including|prior_to|before|earlier_than|older_than|lower_than"
          rf"|below|up_to|through|until)_(?:{_WORDS})?{_HI}")
_JOIN = r"_(?:,_)?(?:and_|but_)?"
TWO_BOUNDS = ("X up to Y", "from X prior to Y", "X and later, prior to Y", "later than X, prior to Y",
              "prior to Y, from X")

# (name, pattern, kind): every version text form NVIDIA writes in its product trees (and its CVE
# index), tried in order. Example texts are in tests/advisories/test_grammar.py (one row per form).
GRAMMAR: list[tuple[str, re.Pattern[str], str]] = [
    ("prior to X", re.compile(rf"(?:{_ALL}_)?(?:prior_to|before(?:_release)?|earlier_than|older_than|lower_than|below)_"
                              rf"(?:{_WORDS})?{_V}(?P<note>_for_support_of_[a-z0-9_.,-]+)?"), "affected"),
    ("up to and including X", re.compile(rf"(?:{_ALL}_)?(?:up_to_and_including|up_to|through|until)_(?:{_WORDS})?{_V}"),
     "affected"),
    ("prior to and including X", re.compile(rf"(?:{_ALL}_)?prior_to_and_including_(?:{_WORDS})?{_V}"), "affected"),
    ("X and earlier", re.compile(rf"{_V}_(?:and|or)_(?:earlier|prior|older|below|lower)(?:_versions?|_releases?)?"),
     "affected"),
    ("X to Y", re.compile(rf"(?:{_ALL}_)?(?:from_)?{_V}(?:_to_|_through_|_?-_?)(?:{_WORDS})?{_V}"), "affected"),
    ("X up to Y", re.compile(
        rf"(?:{_ALL}_)?(?:from_)?(?:{_WORDS})?{_LO}_(?P<uw>up_to_and_including|up_to|until)_(?:{_WORDS})?{_HI}"),
     "affected"),
    ("from X prior to Y", re.compile(
        rf"(?:{_ALL}_)?(?:from|starting_(?:from|with|at))_(?:{_WORDS})?{_LO}{_JOIN}{_UPPER}"), "affected"),
    ("X and later, prior to Y", re.compile(rf"(?:{_ALL}_)?(?:{_WORDS})?{_LO}_{_LATER}{_JOIN}{_UPPER}"), "affected"),
    ("later than X, prior to Y", re.compile(
        rf"(?:{_ALL}_)?(?P<lw>{_LOWER_EXCLUSIVE})_(?:{_WORDS})?{_LO}{_JOIN}{_UPPER}"), "affected"),
    ("prior to Y, from X", re.compile(
        rf"(?:{_ALL}_)?{_UPPER}{_JOIN}(?:(?P<lw>from|starting_(?:from|with|at)|{_LOWER_EXCLUSIVE})_)?(?:{_WORDS})?"
        rf"{_LO}(?P<later>_{_LATER})?"), "affected"),
    ("all X.Y versions prior to Z", re.compile(rf"all_{_V}_(?:versions|releases)_prior_to_{_V}"), "affected"),
    ("all X.Y versions", re.compile(rf"all_{_V}_(?:versions|releases)"), "affected"),
    ("prior to X / prior to the <month> release", re.compile(
        rf"{_ALL}_prior_to_{_V}_?(?P<release>all_versions_prior_to_(?P<incl>and_including_)?{_RELEASE})"), "affected"),
    ("only release X", re.compile(rf"(?:only_(?:version_|release_)?{_V}|{_V}_only)"), "affected"),
    ("X (up to and including <vGPU or release label>)", re.compile(rf"{_V}(?P<labels>(?:_?{_LABEL})+)"), "affected"),
    ("all versions", re.compile(_ALL), "affected"),
    ("X or newer", re.compile(rf"{_V}_(?:or|and)_(?:newer|later|above)"), "fixed"),
    ("X and Y (latest)", re.compile(rf"{_V}_and_{_V}_latest"), "fixed"),
    ("list of releases X, Y", re.compile(rf"(?:{_WORDS})?{_V}(?:(?:_?,_(?:and_|or_)?|_and_|_or_)(?:{_WORDS})?{_V})+"),
     "list"),
    ("vGPU software X", re.compile(r"vgpu_(?:software_)?(\d+(?:[._]\d+)*)"), "fixed"),
    ("X (<vGPU or release label>)", re.compile(
        rf"{_V}(?P<label>_?vgpu_?(?:software_)?\d+(?:[._]\d+)*|_?{_RELEASE}|_latest)?"), "fixed"),
]

# Conditions written after a version text: the range applies only where the node fact matches.
_ARCH_CONDITION = re.compile(
    r"_?only_(?:for_)?gpus_based_on_the_(?P<archs>[a-z_,]+?)_(?:gpu_)?architectures?(?:_(?:are|is)_affected)?$")
_CDI_BELOW = re.compile(rf"_?cdi_mode_only_for_versions_prior_to_{_V}$")
_MODE_CONDITION = re.compile(
    r"_?(?:only_when_(?P<m1>cdi|csv|legacy)(?:_mode)?_is_enabled|(?P<m2>cdi|csv|legacy)_mode_only|only_in_(?P<m3>cdi|csv|legacy)_mode"
    r"|only_when_device_list_strategy_is_(?P<strategy>[a-z_]+))$")
TOOLKIT_MODE = "container_toolkit_mode"
GPU_ARCHITECTURE = "gpu_architecture"


def _dots(match_text: str) -> str:
    """A version as the grammar matched it, written as inventory/versions.py orders it:
    '580_95_05' -> '580.95.05', '1.3.0_rc17' -> '1.3.0rc17', '12.6_update_2' -> '12.6.2' (NVIDIA's
    "X.Y Update N" is release X.Y.N), '10.24.09a' stays."""
    m = re.fullmatch(r"(\d+(?:[._]\d+)*)(?:\.x)?(.*)", match_text)
    if not m:
        return match_text.replace("_", ".")
    release, tail = m.group(1).replace("_", "."), m.group(2).lstrip("_")
    if u := re.fullmatch(r"(?:update_?|u)(\d+)", tail):
        return f"{release}.{u.group(1)}"
    if pre := re.fullmatch(r"[-.]?(rc|alpha|beta|pre|dev)[._]?(\d+)", tail):
        return f"{release}{pre.group(1)}{pre.group(2)}"
    return release + tail


def normalize_version_text(text: str, product: str = "") -> str:
    """A product name's version text in the grammar's form: lower case, words joined by '_',
    dots, commas and hyphens kept ('All versions prior to CUDA Toolkit v12.2' ->
    'all_versions_prior_to_v12.2' for product 'CUDA Toolkit'); texts already in that form (a
    product id's tail) are unchanged. The product's own name is dropped where the text repeats it."""
    t = re.sub(r"\s+", " ", text.lower()).strip()
    for name in sorted({product.lower().strip(), re.sub(r"^nvidia\s+", "", product.lower().strip())} - {""},
                       key=len, reverse=True):
        t = re.sub(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", " ", t)
    t = re.sub(r"\bnvidia\b", " ", t)
    # Comparison signs as words: "< 1.2.3" is "prior to 1.2.3", ">= 1.2.3" "1.2.3 or newer", "> 1.2.3"
    # "later than 1.2.3"; an interval "1.2 <= v < 1.3" is ">= 1.2, < 1.3".
    t = re.sub(r"([0-9][^\s<>=≤]*)\s*(<=|≤|<)\s*[a-z]+\s*(?=<|≤)",
               lambda m: f"{'>' if m.group(2) == '<' else '>='} {m.group(1)}, ", t)
    t = re.sub(r"(?:<=|≤)\s*", " up to and including ", t)
    t = re.sub(r"<\s*", " prior to ", t)
    t = re.sub(r"(?:>=|≥)\s*([^\s,;]+)", r" \1 or newer ", t)
    t = re.sub(r">\s*", " later than ", t)
    t = re.sub(r"\s*,\s*", " , ", t)
    t = re.sub(r"[^a-z0-9.,+-]+", "_", t)
    t = re.sub(r"_(?:are|is)_(?:also_)?affected$", "", t.strip("_.,"))
    return re.sub(r"_+", "_", t).strip("_.,")


@dataclass(frozen=True)
class Bounds:
    """One affected interval, possibly only where a node fact has one of some values."""

    lower: str | None = None
    lower_inclusive: bool = False
    upper: str | None = None
    upper_inclusive: bool = False
    condition: tuple[tuple[str, tuple[str, ...]], ...] = ()  # ((fact, (values...)), ...)


@dataclass(frozen=True)
class Decoded:
    kind: str  # "affected" or "fixed"
    form: str  # the GRAMMAR entry that matched
    parts: tuple[Bounds, ...] = ()  # affected intervals (empty for fixed)
    fixed: str = ""  # fixed version; "" with a vGPU label alone (mapped within the document)
    labels: tuple[str, ...] = ()  # vGPU software releases named with the version ("16.10")


def _order(version: str) -> str:
    """Sort key of a version text, as the inventory compares it ('' sorts first)."""
    return (parse_version("generic", version).key or "") if version.strip() else ""


def _vgpu_labels(text: str) -> tuple[str, ...]:
    return tuple(_dots(m) for m in re.findall(r"vgpu_?(?:software_)?(\d+(?:[._]\d+)+)", text))


def _split_condition(text: str) -> tuple[str, tuple[tuple[str, tuple[str, ...]], ...], str | None]:
    """Strip a trailing condition: (text, condition, cdi_below) where cdi_below splits the range."""
    if m := _ARCH_CONDITION.search(text):
        archs = tuple(a for a in re.split(r"[_,]+", m.group("archs")) if a in components.ARCHITECTURE_NAMES)
        if archs:
            return text[:m.start()], ((GPU_ARCHITECTURE, archs),), None
    if m := _CDI_BELOW.search(text):
        return text[:m.start()], (), _dots(m.group(1))
    if m := _MODE_CONDITION.search(text):
        mode = m.group("m1") or m.group("m2") or m.group("m3")
        if mode is None:  # a device-list strategy: cdi-annotations / cdi-cri are CDI
            mode = "cdi" if "cdi" in (m.group("strategy") or "") else ""
        if mode:
            return text[:m.start()], ((TOOLKIT_MODE, (mode,)),), None
    return text, (), None


def decode_version_text(text: str, listed_affected: bool = False, product: str = "") -> Decoded | None:
    """Decode one NVIDIA version text (a product's name, or an id's tail); None when it does not
    fit a known form.

    `listed_affected`: the product_id is in some CVE's known_affected, so a text that reads as a
    plain (fixed-looking) version is the affected release itself. `product`: the product's name,
    dropped where the text repeats it.
    """
    body, condition, cdi_below = _split_condition(normalize_version_text(text, product))
    for form, pattern, kind in GRAMMAR:
        m = pattern.fullmatch(body)
        if not m:
            continue
        if kind == "list":
            versions = [_dots(v) for v in re.findall(_V, re.sub(_WORDS, "", body))]
            if not listed_affected:
                return Decoded("fixed", form, fixed=min(versions, key=_order), labels=_vgpu_labels(body))
            return Decoded("affected", form, tuple(Bounds(v, True, v, True, condition) for v in versions))
        if kind == "fixed":
            if listed_affected and form.startswith("X (") and not m.group("label"):
                exact = _dots(m.group(1))
                return Decoded("affected", "bare affected release X",
                               (Bounds(exact, True, exact, True, condition),))
            fixed = _dots(m.group(1)) if form != "vGPU software X" else ""
            return Decoded("fixed", form, fixed=fixed, labels=_vgpu_labels(body))
        bounds = _affected_bounds(form, m)
        if bounds is None:
            return None
        if form == "X to Y" and bounds.lower and bounds.upper and _order(bounds.upper) < _order(bounds.lower):
            continue  # "4.1.1-4.0.4" is one (compound) version, not a range
        if form in TWO_BOUNDS and _empty(bounds):
            return None  # an empty range is a misreading, not "nothing is affected"
        if cdi_below:
            # "up to and including X (CDI mode only for versions prior to Y)": [Y, X] in every
            # mode, and below Y only in CDI mode.
            return Decoded("affected", form + " (CDI mode only below Y)", (
                Bounds(cdi_below, True, bounds.upper, bounds.upper_inclusive, condition),
                Bounds(bounds.lower, bounds.lower_inclusive, cdi_below, False, ((TOOLKIT_MODE, ("cdi",)),)),
            ), labels=_vgpu_labels(body))
        return Decoded("affected", form, (Bounds(bounds.lower, bounds.lower_inclusive, bounds.upper,
                                                 bounds.upper_inclusive, condition),), labels=_vgpu_labels(body))
    return None


def _empty(bounds: Bounds) -> bool:
    """Two bounds that leave no version between them (upper below lower, or equal and one excluded)."""
    if not (bounds.lower and bounds.upper):
        return False
    lower, upper = _order(bounds.lower), _order(bounds.upper)
    return upper < lower or (upper == lower and not (bounds.lower_inclusive and bounds.upper_inclusive))


def _affected_bounds(form: str, m: re.Match[str]) -> Bounds | None:
    if form == "prior to X":
        return Bounds(upper=_dots(m.group(1)))
    if form in ("up to and including X", "prior to and including X", "X and earlier",
                "X (up to and including <vGPU or release label>)"):
        return Bounds(upper=_dots(m.group(1)), upper_inclusive=True)
    if form == "X to Y":
        return Bounds(_dots(m.group(1)), True, _dots(m.group(2)), True)
    if form in TWO_BOUNDS:
        groups = m.groupdict()
        if form == "prior to Y, from X" and not (groups["lw"] or groups["later"]):
            return None  # "prior to Y, X": X bounds nothing
        lower_word = groups.get("lw") or ""
        return Bounds(_dots(groups["lo"]), not re.fullmatch(_LOWER_EXCLUSIVE, lower_word), _dots(groups["hi"]),
                      groups["uw"] in _UPPER_INCLUSIVE)
    if form == "only release X":
        exact = _dots(m.group(1) or m.group(2))
        return Bounds(exact, True, exact, True)
    if form == "all X.Y versions prior to Z":
        return Bounds(_dots(m.group(1)), True, _dots(m.group(2)), False)
    if form == "all X.Y versions":
        line = [int(p) for p in re.split(r"[._]", re.sub(r"\.x$", "", m.group(1)))]
        following = ".".join(str(p) for p in [*line[:-1], line[-1] + 1])
        return Bounds(_dots(m.group(1)), True, following, False)
    if form == "prior to X / prior to the <month> release":
        # "prior to and including the February 2023 release", whose driver is X: X is affected.
        return Bounds(upper=_dots(m.group(1)), upper_inclusive=bool(m.group("incl")))
    if form == "all versions":
        return Bounds()
    return None


# --- product classification -------------------------------------------------------------------


def classify_component(product_name: str, architecture: str) -> str:
    """The inventory component a product row is about; '' when no registered component names it."""
    component = components.classify(product_name, architecture)
    return component.name if component else ""


def classify_product_lines(product_name: str, architecture: str) -> list[str]:
    """Product lines a driver row covers ("GeForce, NVIDIA RTX/Quadro, NVS" covers two)."""
    name = product_name.lower()
    qualifier = _arch_qualifier(architecture).lower()
    if "cloud gaming" in name or "gaming" in qualifier:
        return ["cloud_gaming"]
    if "virtual gpu manager" in name:
        return ["vgpu_manager"]
    if "guest driver" in name or "vgpu" in qualifier:
        return ["vgpu_guest"]
    lines = []
    if "tesla" in name:
        lines.append("tesla")
    if "geforce" in name:
        lines.append("geforce")
    if "quadro" in name or "rtx" in name or "nvs" in name:
        lines.append("rtx_quadro")
    if "studio" in name:
        lines.append("studio")
    return lines or [""]


def _arch_qualifier(architecture: str) -> str:
    m = re.search(r"\(([^)]*)\)\s*$", architecture)
    return m.group(1) if m else ""


def classify_os(architecture: str, product_line: str) -> list[str]:
    """The node OS families a row is for ('' = any). Platform rows never cross: a Windows row is
    not a Linux node's, a Jetson (Tegra) row not an x86 Linux node's, whatever the component."""
    base = re.sub(r"\([^)]*\)\s*$", "", architecture).strip().lower()
    if re.search(r"\b(?:jetson|tegra|l4t|jetpack)\b", base):
        return ["jetson"]
    if re.search(r"\b(?:macos|mac os|os x)\b", base):
        return ["macos"]
    if product_line == "vgpu_manager" or (product_line == "cloud_gaming" and not base.startswith(("linux", "windows"))):
        return ["hypervisor"]
    has_linux = "linux" in base and not any(h in base for h in ("kvm", "hypervisor", "vsphere"))
    has_windows = base.startswith("windows") or base.startswith("microsoft windows")
    if has_windows and "linux" in base:
        return ["windows", "linux"]
    if has_windows:
        return ["windows"]
    if has_linux or base.startswith("linux"):
        return ["linux"]
    return [""]


def driver_branch(architecture: str) -> str:
    m = re.search(r"\(R(\d{3})\b", architecture)
    return f"R{m.group(1)}" if m else ""


# A branch's driver versions start at its number: Linux R570 ships 570.x, Windows R570 571.x to
# 573.x, Windows R418 up to 426.x. A branch the bulletin skips starts BRANCH_SPAN above a named one.
BRANCH_SPAN = 5
# A version at least this far above its row's branch label is not of that branch.
BRANCH_REACH = 10


def branch_of_version(version: str) -> int | None:
    head = version.split(".")[0]
    return int(head) if head.isdigit() and len(head) == 3 else None


def _row_branch(label: str, versions: list[str], labels: set[int]) -> str:
    """The branch a driver row is in: its label unless its versions say otherwise.

    NVIDIA's tables sometimes carry the branch of the row above ("Windows(R570 vGPU 13)" over
    474.64): a version below the label, or BRANCH_REACH above it, is the better witness. It is
    in the highest branch the document labels elsewhere below it (474.64 and 475.06 are R470),
    else the version rounded down to a multiple of 5. Rows without a label (Cloud Gaming) keep none.
    """
    majors = [b for b in (branch_of_version(v) for v in versions) if b is not None]
    if not label or not majors:
        return label
    major = majors[0]
    if int(label[1:]) <= major < int(label[1:]) + BRANCH_REACH:
        return label
    near = [b for b in labels if b <= major < b + BRANCH_REACH]
    return f"R{max(near)}" if near else f"R{major - major % 5}"


def _scope(component: components.Component, leaf_name: str, architecture: str) -> dict[str, str]:
    text = f"{leaf_name} {architecture}"
    if component.scope == components.SCOPE_GPU_MODEL:
        models = components.gpu_models(text)
        return {components.SCOPE_GPU_MODEL: models[0]} if models else {}
    if component.scope == components.SCOPE_PLATFORM:
        platform = components.platform_of(text)
        return {components.SCOPE_PLATFORM: platform} if platform else {}
    return {}


# --- the document ---------------------------------------------------------------------------------


def _leaf_version_text(product: dict[str, Any]) -> str | None:
    """The version text of a product_version leaf: its product's name, as NVIDIA writes it.

    Never the product_id or the CPE: they are the name with its punctuation dropped, so
    "0.0-26.05" reads there as the single version 0.026.05. Ids only identify.
    """
    name = str(product.get("name", "")).strip()
    return name or None


def _tracking(doc: dict[str, Any], document: str) -> tuple[dict[str, Any], str, list[dict[str, str]]]:
    """document.tracking with its version and revision history validated (CSAF 2.0 version_t)."""
    tracking = _req(doc, "tracking", dict, document, "document")
    tracking_version = _req(tracking, "version", str, document, "document.tracking")
    if not is_version(tracking_version):
        raise DocumentError(document, f"document.tracking.version {tracking_version!r} is not a CSAF version "
                            "(an integer or a semantic version such as 1.0.0)")
    history_raw = _req(tracking, "revision_history", list, document, "document.tracking")
    if not history_raw:
        raise DocumentError(document, "document.tracking.revision_history is empty")
    history: list[dict[str, str]] = []
    for i, entry in enumerate(history_raw):
        where = f"document.tracking.revision_history[{i}]"
        number = _req(entry, "number", str, document, where)
        if not is_version(number):
            raise DocumentError(document, f"{where}.number {number!r} is not a CSAF version")
        _date(_req(entry, "date", str, document, where), document, f"{where}.date")
        history.append({"number": number, "date": entry["date"], "summary": _req(entry, "summary", str, document,
                                                                                  where)})
    latest = max((h["number"] for h in history), key=version_tuple)
    if version_tuple(latest) > version_tuple(tracking_version):
        raise DocumentError(document, f"revision history names {latest}, newer than document.tracking.version "
                            f"{tracking_version}")
    return tracking, tracking_version, history


def parse(content: bytes, document: str) -> ParsedAdvisory:
    """Parse one CSAF 2.0 document. `document` names it in errors (a path or URL)."""
    try:
        data = json.loads(content)
    except UnicodeDecodeError as exc:
        raise DocumentError(document, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(document, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise DocumentError(document, f"top level should be an object, got {type(data).__name__}")
    doc = _req(data, "document", dict, document, "$")
    csaf_version = _req(doc, "csaf_version", str, document, "document")
    if csaf_version != "2.0":
        raise DocumentError(document, f"csaf_version {csaf_version!r} is not supported (2.0 is)")
    title = _req(doc, "title", str, document, "document")
    publisher = _req(doc, "publisher", dict, document, "document")
    publisher_name = _req(publisher, "name", str, document, "document.publisher")
    tracking, tracking_version, history = _tracking(doc, document)
    publisher_id = _req(tracking, "id", str, document, "document.tracking").strip()
    if not publisher_id:
        raise DocumentError(document, "document.tracking.id is empty")
    initial = _date(_req(tracking, "initial_release_date", str, document, "document.tracking"), document,
                    "document.tracking.initial_release_date")
    current = _date(_req(tracking, "current_release_date", str, document, "document.tracking"), document,
                    "document.tracking.current_release_date")
    aggregate = _opt(doc, "aggregate_severity", dict, document, "document")
    severity = Severity.normalize(aggregate.get("text") if aggregate else None)
    summary = ""
    for note in _opt(doc, "notes", list, document, "document") or []:
        if isinstance(note, dict) and note.get("category") == "summary" and isinstance(note.get("text"), str):
            summary = note["text"]
            break

    short_name = publisher_name.split()[0] if publisher_name.strip() else publisher_name
    parsed = ParsedAdvisory(
        publisher=short_name, publisher_id=publisher_id, title=title, tracking_version=tracking_version,
        status=str(tracking.get("status", "")), initial_release_date=initial, current_release_date=current,
        revision_history=history, severity=severity, summary=summary,
        content_sha256=hashlib.sha256(content).hexdigest(),
    )

    tree = _req(data, "product_tree", dict, document, "$")
    branches = _req(tree, "branches", list, document, "product_tree")
    leaves = _walk_tree(branches, document)
    cves = _parse_vulnerabilities(data, document)
    parsed.cves = cves
    if not parsed.severity:
        parsed.severity = Severity.worst([c.severity for c in cves])
    _read_products(parsed, leaves, earlier_notes(data))
    return parsed


def _read_products(parsed: ParsedAdvisory, leaves: list[_Leaf], earlier: dict[str, Earlier]) -> None:
    """The ranges and review notes of a document's leaves, read with its CVEs' product status."""
    affected_by: dict[str, list[str]] = {}
    fixed_by: dict[str, set[str]] = {}
    for cve in parsed.cves:
        for pid in cve.affected_product_ids:
            affected_by.setdefault(pid, []).append(cve.cve_id)
        for pid in cve.fixed_product_ids:
            fixed_by.setdefault(pid, set()).add(cve.cve_id)
    ranges, review, read = _ranges(leaves, affected_by, fixed_by, earlier)
    parsed.rows = {leaf.product_id: leaf.text or "" for leaf in leaves}
    parsed.read_rows = read
    ranges += _unsupported_branches(ranges, review)
    ranges += _older_branches(ranges, review, earlier.get("branch"))
    ranges = comparable_bounds(ranges, review)
    known = {leaf.product_id for leaf in leaves}
    for cve in parsed.cves:
        for pid in cve.affected_product_ids:
            if pid not in known:
                review.append(ReviewNote(pid, ReviewKind.UNKNOWN_PRODUCT, pid,
                                         f"{cve.cve_id} names a product that is not a product_version"))
    parsed.ranges = ranges
    parsed.review = _unique(review)


def bound_key(component: str, version: str | None) -> str | None:
    """A range bound as the inventory's sort key; None for no bound, or one that is no comparable
    version. A branch bound ("570") sorts below every 570.x."""
    if not version:
        return None
    try:
        if version.isdigit():
            return sort_key((int(version),))
        return parse_version(component, version).key
    except VersionError:
        return None


def comparable_bounds(ranges: list[ParsedRange], review: list[ReviewNote]) -> list[ParsedRange]:
    """A range whose bound is no comparable version is presumed (any version of the product) and
    its row a review item (added to `review`): what the ingest stores is what the parse says."""
    out = []
    for rng in ranges:
        if (rng.lower and bound_key(rng.component, rng.lower) is None) or (
                rng.upper and bound_key(rng.component, rng.upper) is None):
            review.append(ReviewNote(rng.product_id, ReviewKind.UNPARSED_ROW, rng.raw,
                                     f"range bound {rng.lower or ''}..{rng.upper or ''} is not a comparable version",
                                     rng.component))
            rng = replace(rng, lower=None, upper=None, basis=RangeBasis.UNDECODED)
        out.append(rng)
    return out


# Keys of what a bulletin leaves out that gpusweep still accounts for (see _unsupported_branches
# and _older_branches): the gap's ranges, one per OS and product line, and its review item.
GAP = "unsupported_branch"
OLDER = "older_branch"
OLDER_REVIEW = "older_branches"


def entry_of(key: str) -> str:
    """The bulletin entry a range's product_id or a review item's key belongs to, which
    advisories.coverage counts: a product row ('pid#1', a later interval, and 'pid#earlier', the
    releases before it, are the row 'pid'), or a gap the bulletin leaves: every range of the
    branches it skips between R535 and R570 is the gap 'unsupported_branch:R535-R570' that its
    review item names, every range of branches older than it lists is 'older_branches'."""
    base = key.split("#", 1)[0]
    if base.startswith(f"{GAP}:") and base.count(":") == 3:
        return f"{GAP}:{base.rsplit(':', 1)[1]}"
    if base.startswith(f"{OLDER}:"):
        return OLDER_REVIEW
    return base


def _unique(notes: list[ReviewNote]) -> list[ReviewNote]:
    seen: dict[str, ReviewNote] = {}
    for note in notes:
        seen.setdefault(note.key, note)
    return list(seen.values())


@dataclass(frozen=True)
class _Leaf:
    product_id: str
    name: str
    architecture: str
    group: tuple[int, str]  # (architecture ordinal, product_name prefix): rows that pair up
    text: str | None


def _walk_tree(branches: list[Any], document: str) -> list[_Leaf]:
    prefixes: list[str] = []
    leaves: list[_Leaf] = []
    pending: list[tuple[dict[str, Any], str, int]] = []
    arch_counter = 0

    def walk(items: list[Any], path: str, arch: str, arch_no: int) -> None:
        nonlocal arch_counter
        for i, item in enumerate(items):
            where = f"{path}[{i}]"
            if not isinstance(item, dict):
                raise DocumentError(document, f"{where} is not an object")
            category = _req(item, "category", str, document, where)
            _req(item, "name", str, document, where)
            product = item.get("product")
            children = item.get("branches")
            if children is not None and not isinstance(children, list):
                raise DocumentError(document, f"{where}.branches should be list")
            if product is None and not children:
                raise DocumentError(document, f"unknown product tree shape: {where} has neither product nor branches")
            if product is not None:
                if not isinstance(product, dict):
                    raise DocumentError(document, f"{where}.product should be object")
                _req(product, "product_id", str, document, f"{where}.product")
                _req(product, "name", str, document, f"{where}.product")
                if category == "product_name":
                    prefixes.append(product["product_id"])
                elif category == "product_version":
                    pending.append((item, arch, arch_no))
            if children:
                if category == "architecture":
                    arch_counter += 1
                    walk(children, f"{where}.branches", item["name"], arch_counter)
                else:
                    walk(children, f"{where}.branches", arch, arch_no)

    walk(branches, "product_tree.branches", "", 0)
    for item, arch, arch_no in pending:
        product = item["product"]
        pid = product["product_id"]
        prefix = next((p for p in sorted(prefixes, key=len, reverse=True) if pid.startswith(p + "_")), "")
        leaves.append(_Leaf(pid, item["name"], arch, (arch_no, prefix or item["name"]),
                            _leaf_version_text(product)))
    return leaves


Rows = list[tuple[_Leaf, "Decoded | None"]]


@dataclass
class _Reading:
    """What one document's leaves are turning into, shared by the passes below."""

    affected_by: dict[str, list[str]]
    fixed_by: dict[str, set[str]]  # product_id -> the CVEs it is the fix of
    labels: set[int]  # driver branches the document labels anywhere
    earlier: dict[str, Earlier] = field(default_factory=dict)  # what the notes say of older releases
    # (product, vGPU software release) -> driver version, from this document's own rows: a
    # Virtual GPU Manager and a guest driver of one release have different versions.
    vgpu_versions: dict[tuple[str, str], str] = field(default_factory=dict)
    ranges: list[ParsedRange] = field(default_factory=list)
    review: list[ReviewNote] = field(default_factory=list)


def _ranges(leaves: list[_Leaf], affected_by: dict[str, list[str]], fixed_by: dict[str, set[str]],
            earlier: dict[str, Earlier]) -> tuple[list[ParsedRange], list[ReviewNote], set[str]]:
    """Ranges from the leaves; a leaf that does not decode is a review item, and a presumed range
    unless it is only ever a fixed row (it hits nobody itself)."""
    reading = _Reading(affected_by, fixed_by,
                       {int(b[1:]) for b in (driver_branch(leaf.architecture) for leaf in leaves) if b}, earlier)
    groups: dict[tuple[int, str], Rows] = {}
    for leaf in leaves:
        decoded = (decode_version_text(leaf.text, leaf.product_id in affected_by, leaf.name)
                   if leaf.text else None)
        if decoded is not None and decoded.form in RELEASE_POINTS:
            decoded = _bare_release(decoded, earlier.get("release"))
        groups.setdefault(leaf.group, []).append((leaf, decoded))
        if decoded is not None:
            version = decoded.fixed or (decoded.parts[0].upper if decoded.parts and decoded.parts[0].upper_inclusive
                                        else "")
            for label in decoded.labels:
                if version:
                    reading.vgpu_versions.setdefault((leaf.name, label), version)
    for rows in groups.values():
        _undecoded(rows, reading)
        for index, (leaf, decoded) in enumerate(rows):
            component = components.classify(leaf.name, leaf.architecture)
            if component is not None and decoded is not None and decoded.kind == "affected":
                _affected(rows, index, component, decoded, reading)
    read = {leaf.product_id for rows in groups.values() for leaf, decoded in rows if decoded is not None}
    return reading.ranges, reading.review, read


def _undecoded(rows: Rows, reading: _Reading) -> None:
    """Rows of no component, and rows that do not decode: review items (and presumed ranges)."""
    for index, (leaf, decoded) in enumerate(rows):
        component = components.classify(leaf.name, leaf.architecture)
        if component is None:
            reading.review.append(ReviewNote(leaf.product_id, ReviewKind.UNMAPPED_PRODUCT, leaf.text or leaf.product_id,
                                             f"no inventory component is {leaf.name!r} ({leaf.architecture})"))
            continue
        if decoded is not None and decoded.kind == "fixed" and not decoded.fixed:
            mapped = next((reading.vgpu_versions[(leaf.name, label)] for label in decoded.labels
                           if (leaf.name, label) in reading.vgpu_versions), "")
            rows[index] = (leaf, Decoded("fixed", decoded.form, fixed=mapped, labels=decoded.labels)
                           if mapped else None)
            decoded = rows[index][1]
        if decoded is not None:
            continue
        reading.review.append(ReviewNote(leaf.product_id, ReviewKind.UNPARSED_ROW, leaf.text or leaf.product_id,
                                         f"version text {leaf.text or ''!r} not understood ({leaf.architecture} / "
                                         f"{leaf.name}): its nodes are presumed exposed", component.name))
        pid = leaf.product_id
        if pid in reading.affected_by or (pid not in reading.fixed_by and not _fixed_only(leaf, rows)):
            # Its own fixed row may still read: then nodes from that version on are not presumed.
            # Only a row that fixes every CVE this one is affected by: never another CVE's fix.
            cves = set(reading.affected_by.get(pid, []))
            fixed_leaf, fixed = next(((lf, d) for lf, d in rows[index + 1:] + rows[:index][::-1]
                                      if d is not None and d.kind == "fixed" and d.fixed and cves
                                      and cves <= reading.fixed_by.get(lf.product_id, set())), (None, None))
            reading.ranges += _rows(leaf, component, None, fixed.fixed if fixed else "",
                                    fixed_leaf.product_id if fixed_leaf else "", reading.affected_by,
                                    RangeBasis.UNDECODED, reading.labels)


def _affected(rows: Rows, index: int, component: components.Component, decoded: Decoded, reading: _Reading) -> None:
    """A decoded affected row, paired with its fixed row: the fixed row follows it, or precedes it."""
    leaf = rows[index][0]
    after = [(lf, d) for lf, d in rows[index + 1:] if d is not None and d.kind == "fixed"]
    before = [(lf, d) for lf, d in rows[:index] if d is not None and d.kind == "fixed"]
    fixed_leaf, fixed = (after[0] if after else before[-1]) if (after or before) else (None, None)
    last = decoded.parts[0]
    fixed_version = fixed.fixed if fixed else (last.upper if last.upper and not last.upper_inclusive else "")
    if all(p.upper is None and p.lower is None for p in decoded.parts) and not fixed_version:
        reading.review.append(ReviewNote(leaf.product_id, ReviewKind.UNPARSED_ROW, leaf.text or "",
                                         "affects all versions and names no fixed version we can read",
                                         component.name))
        reading.ranges += _rows(leaf, component, None, "", "", reading.affected_by, RangeBasis.UNDECODED,
                                reading.labels)
        return
    rows_ranges = _rows(leaf, component, decoded, fixed_version, fixed_leaf.product_id if fixed_leaf else "",
                        reading.affected_by, RangeBasis.DECODED, reading.labels)
    reading.ranges += rows_ranges
    if decoded.form in RELEASE_POINTS:
        _earlier_releases(leaf, component, decoded, fixed_version, fixed_leaf, reading)
    branch = rows_ranges[-1].branch if rows_ranges else ""
    fixed_major = branch_of_version(fixed_version)
    # Cloud Gaming moves to a new branch with every release; elsewhere a fixed version far from
    # its row's branch is a typo in the bulletin worth a human's look.
    if (component.name == components.DRIVER and branch and fixed_major is not None
            and rows_ranges[-1].product_line != "cloud_gaming"
            and not int(branch[1:]) <= fixed_major < int(branch[1:]) + BRANCH_REACH):
        reading.review.append(ReviewNote(
            fixed_leaf.product_id if fixed_leaf else leaf.product_id, ReviewKind.UNPARSED_ROW,
            (fixed_leaf.text or "") if fixed_leaf else "",
            f"fixed version {fixed_version} is outside branch {branch} of its affected row "
            f"({leaf.architecture}): the remediation named is likely a typo", component.name))


# Rows that name affected releases one by one ("24.11"; "3, 10"): what lies below them is what
# the bulletin's notes say.
RELEASE_POINTS = ("bare affected release X", "list of releases X, Y")


def _bare_release(decoded: Decoded, earlier: Earlier | None) -> Decoded:
    """A bare affected release X (or a list of them) is [X, X] only when the notes say earlier
    releases are not affected; when they say earlier ones are, it is every release up to X (up to
    the highest listed)."""
    if earlier is None or earlier.status != "affected":
        return decoded
    top = max(decoded.parts, key=lambda p: _order(p.upper or ""))
    return replace(decoded, parts=(replace(top, lower=None, lower_inclusive=False),))


def _earlier_releases(leaf: _Leaf, component: components.Component, decoded: Decoded, fixed_version: str,
                      fixed_leaf: _Leaf | None, reading: _Reading) -> None:
    """The releases before a bare affected release the notes hedge on (or keep silent about):
    presumed, the sentence quoted; silence is also a review item."""
    earlier = reading.earlier.get("release")
    part = min(decoded.parts, key=lambda p: _order(p.lower or ""))
    if part.lower is None or (earlier is not None and earlier.status == "not_affected"):
        return
    if earlier is not None and earlier.sentence:
        why = f'earlier releases presumed affected: the bulletin says "{earlier.sentence}"'
    else:
        why = f"the bulletin names only release {part.lower} and says nothing of earlier ones: presumed affected"
        reading.review.append(ReviewNote(f"{leaf.product_id}#earlier", ReviewKind.UNPARSED_ROW, leaf.text or "",
                                         why, component.name))
    below = Decoded("affected", decoded.form, (Bounds(None, False, part.lower, False, part.condition),))
    reading.ranges += [replace(r, product_id=f"{leaf.product_id}#earlier", remediation=why)
                       for r in _rows(leaf, component, below, fixed_version,
                                      fixed_leaf.product_id if fixed_leaf else "", reading.affected_by,
                                      RangeBasis.UNDECODED, reading.labels)]


def _fixed_only(leaf: _Leaf, rows: Rows) -> bool:
    """An undecodable row that is the fixed side of a decoded affected row (it hits nobody itself)."""
    index = next(i for i, (lf, _d) in enumerate(rows) if lf is leaf)
    neighbours = [d for _lf, d in rows[:index]] + [d for _lf, d in rows[index + 1:]]
    return any(d is not None and d.kind == "affected" for d in neighbours)


def _rows(leaf: _Leaf, component: components.Component, decoded: Decoded | None, fixed_version: str,
          fixed_product_id: str, affected_by: dict[str, list[str]], basis: str, labels: set[int]) -> list[ParsedRange]:
    """The ranges of one affected row: per product line and OS for drivers, per interval."""
    is_driver = component.name == components.DRIVER
    lines = classify_product_lines(leaf.name, leaf.architecture) if is_driver else [""]
    parts = decoded.parts if decoded is not None else (Bounds(),)
    versions = [v for p in parts for v in (p.lower, p.upper) if v] + ([fixed_version] if fixed_version else [])
    branch = _row_branch(driver_branch(leaf.architecture), versions, labels) if is_driver else ""
    scope = _scope(component, leaf.name, leaf.architecture)
    out: list[ParsedRange] = []
    for part_no, part in enumerate(parts):
        lower, lower_inclusive = part.lower, part.lower_inclusive
        upper, upper_inclusive = part.upper, part.upper_inclusive
        if upper is None and lower is None and fixed_version:
            upper, upper_inclusive = fixed_version, False
        if is_driver and branch:
            # The branch bounds the row: Windows R535 drivers are 538.x, and an inventory reports
            # the version, so the bounds, not the label, decide (a row is one branch's).
            if lower is None:
                lower, lower_inclusive = branch[1:], True
            if upper is None:  # an undecoded row: its branch, up to the next one (see below)
                upper, upper_inclusive = str(int(branch[1:]) + BRANCH_REACH), False
        product_id = leaf.product_id if part_no == 0 else f"{leaf.product_id}#{part_no}"
        for line in lines:
            for os_family in classify_os(leaf.architecture, line):
                out.append(ParsedRange(
                    product_id=product_id, product_name=leaf.name, component=component.name,
                    os_family=os_family, branch=branch, product_line=line, architecture=leaf.architecture,
                    raw=leaf.text or "", lower=lower, lower_inclusive=lower_inclusive, upper=upper,
                    upper_inclusive=upper_inclusive, fixed_version=fixed_version, fixed_product_id=fixed_product_id,
                    cve_ids=tuple(sorted(set(affected_by.get(leaf.product_id, [])))), basis=basis, scope=scope,
                    condition={fact: list(values) for fact, values in part.condition},
                    remediation=(f"update to {fixed_version}" if fixed_version else
                                 "the bulletin's row could not be read: check it and update to its fixed version"),
                ))
    return out


def _unsupported_branches(ranges: list[ParsedRange], review: list[ReviewNote]) -> list[ParsedRange]:
    """Presumed ranges for driver branches a bulletin skips between older and newer ones it names.

    NVIDIA lists the branches it still supports; a node on one it skips (say R550 when R535 and
    R570 are listed) gets no fixed version, which is not the same as not affected. Per OS and
    product line, a gap between two named branches is a range, from past the lower branch's
    versions (its number + BRANCH_SPAN at least) to the upper branch, whose remediation is to move
    to a supported branch's fixed version. Undecoded rows of a named branch end where the next
    named branch starts. Changes `ranges` in place; returns the gap ranges.
    """
    named: dict[tuple[str, str], dict[int, list[int]]] = {}
    for i, r in enumerate(ranges):
        if r.component == components.DRIVER and r.branch:
            named.setdefault((r.os_family, r.product_line), {}).setdefault(int(r.branch[1:]), []).append(i)
    out: list[ParsedRange] = []
    gaps: dict[tuple[int, int], list[str]] = {}
    for (os_family, line), by_branch in sorted(named.items()):
        listed = sorted(by_branch)
        for low, high in pairwise(listed):
            for i in by_branch[low]:
                if ranges[i].basis == RangeBasis.UNDECODED and not ranges[i].fixed_version:
                    ranges[i] = replace(ranges[i], upper=str(min(high, low + BRANCH_REACH)))
            seen = [b for i in by_branch[low] for v in (ranges[i].upper, ranges[i].fixed_version) if v
                    for b in [branch_of_version(v)] if b is not None and b < high]
            start = max([low + BRANCH_SPAN, *(b + 1 for b in seen)])
            if start >= high:
                continue
            lower_rows, upper_rows = [ranges[i] for i in by_branch[low]], [ranges[i] for i in by_branch[high]]
            fixes = [f"R{b} {rows[0].fixed_version}" for b, rows in ((high, upper_rows), (low, lower_rows))
                     if rows[0].fixed_version]
            out.append(ParsedRange(
                product_id=f"{GAP}:{os_family or 'any'}:{line or 'any'}:R{low}-R{high}",
                product_name=f"{upper_rows[0].product_name} (branches between R{low} and R{high})",
                component=components.DRIVER, os_family=os_family, branch="", product_line=line,
                architecture=upper_rows[0].architecture, raw=f"no row for branches between R{low} and R{high}",
                lower=str(start), lower_inclusive=True, upper=str(high), upper_inclusive=False,
                fixed_version=upper_rows[0].fixed_version, fixed_product_id="",
                cve_ids=tuple(sorted({c for r in lower_rows + upper_rows for c in r.cve_ids})),
                basis=RangeBasis.UNSUPPORTED_BRANCH,
                remediation=("move to a supported branch: " + " or ".join(fixes)) if fixes else
                "move to a branch the bulletin names",
            ))
            gaps.setdefault((low, high), []).append(f"{os_family or 'any OS'}/{line or 'any line'}")
    for (low, high), where in sorted(gaps.items()):
        review.append(ReviewNote(
            f"{GAP}:R{low}-R{high}", ReviewKind.UNSUPPORTED_BRANCH, f"between R{low} and R{high}",
            f"no fixed version for driver branches between R{low} and R{high} ({', '.join(where)}): NVIDIA no "
            "longer supports them; nodes on them are presumed exposed", components.DRIVER))
    return out


@dataclass(frozen=True)
class Earlier:
    """What a bulletin's notes say of releases (or driver branches) older than its table lists."""

    status: str  # "affected", "hedged" (may / might be affected) or "not_affected"
    sentence: str


_EARLIER = re.compile(r"\b(?:earlier|older|previous|prior)\b[^.]*?\b(?:releases?|versions?)\b[^.]*?\baffected\b",
                      re.I)


def earlier_notes(data: dict[str, Any]) -> dict[str, Earlier]:
    """{"release": ..., "branch": ...}: the first sentence of the notes (the document's and each
    vulnerability's) about earlier releases, and about earlier branches. A sentence about
    branches speaks for releases too when none is about releases alone."""
    notes = list((data.get("document") or {}).get("notes") or [])
    for vuln in data.get("vulnerabilities") or []:
        notes += (vuln.get("notes") or []) if isinstance(vuln, dict) else []
    texts = [str(n.get("text", "")) for n in notes if isinstance(n, dict)]
    sentences = [s.strip() for t in texts for chunk in re.split(r"<[^>]+>|\n", t)
                 for s in re.split(r"(?<=[.!?])\s+", chunk)]
    out: dict[str, Earlier] = {}
    for sentence in sentences:
        if not _EARLIER.search(sentence):
            continue
        status = ("not_affected" if re.search(r"\bnot\b", sentence, re.I) else
                  "hedged" if re.search(r"\b(?:may|might|could|possibly)\b", sentence, re.I) else "affected")
        out.setdefault("branch" if re.search(r"\bbranch", sentence, re.I) else "release", Earlier(status, sentence))
    if "release" not in out and "branch" in out:
        out["release"] = out["branch"]
    return out


def _older_branches(ranges: list[ParsedRange], review: list[ReviewNote], earlier: Earlier | None) -> list[ParsedRange]:
    """Driver branches older than the oldest a bulletin names (per OS and product line).

    Presumed exposed, the sentence quoted, when the notes say earlier branches are (or may be)
    affected; a review item otherwise: the bulletin does not say, and silence is not "safe".
    """
    oldest: dict[tuple[str, str], tuple[int, ParsedRange]] = {}
    for r in ranges:
        if r.component == components.DRIVER and r.branch and r.basis == RangeBasis.DECODED:
            key, number = (r.os_family, r.product_line), int(r.branch[1:])
            if key not in oldest or number < oldest[key][0]:
                oldest[key] = (number, r)
    if not oldest:
        return []
    if earlier is None or earlier.status == "not_affected":
        if earlier is None:
            branches = ", ".join(sorted({f"R{n}" for n, _r in oldest.values()}))
            review.append(ReviewNote(OLDER_REVIEW, ReviewKind.UNSUPPORTED_BRANCH, f"older than {branches}",
                                     f"the bulletin names branches down to {branches} and says nothing of older "
                                     "ones: check whether nodes on them are affected", components.DRIVER))
        return []
    why = f'older branches presumed affected: the bulletin says "{earlier.sentence}"'
    out = [ParsedRange(
        product_id=f"{OLDER}:{os_family or 'any'}:{line or 'any'}:R{number}",
        product_name=f"{r.product_name} (branches older than R{number})", component=components.DRIVER,
        os_family=os_family, branch="", product_line=line, architecture=r.architecture,
        raw=f"no row for branches older than R{number}", lower=None, lower_inclusive=False, upper=str(number),
        upper_inclusive=False, fixed_version=r.fixed_version, fixed_product_id="", cve_ids=r.cve_ids,
        basis=RangeBasis.UNSUPPORTED_BRANCH,
        remediation=f"move to a supported branch: R{number} {r.fixed_version}. {why}" if r.fixed_version else why,
    ) for (os_family, line), (number, r) in sorted(oldest.items())]
    return out


def _parse_vulnerabilities(data: dict[str, Any], document: str) -> list[ParsedCVE]:
    vulns = _opt(data, "vulnerabilities", list, document, "$") or []
    cves: list[ParsedCVE] = []
    for i, vuln in enumerate(vulns):
        where = f"vulnerabilities[{i}]"
        cve_id = _req(vuln, "cve", str, document, where).strip().upper()
        if not re.fullmatch(r"CVE-\d{4}-\d{4,}", cve_id):
            raise DocumentError(document, f"{where}.cve {cve_id!r} is not a CVE id")
        status = _opt(vuln, "product_status", dict, document, where) or {}
        affected: list[str] = []
        for key in ("known_affected", "first_affected", "last_affected"):
            ids = _opt(status, key, list, document, f"{where}.product_status") or []
            affected.extend(str(x) for x in ids)
        fixed = [str(x) for x in (_opt(status, "fixed", list, document, f"{where}.product_status") or [])]
        vector, score, severity = "", None, ""
        for j, entry in enumerate(_opt(vuln, "scores", list, document, where) or []):
            cvss = _opt(entry, "cvss_v3", dict, document, f"{where}.scores[{j}]")
            if cvss:
                vector = str(cvss.get("vectorString", ""))
                raw_score = cvss.get("baseScore")
                if raw_score is not None and not isinstance(raw_score, int | float):
                    raise DocumentError(document, f"{where}.scores[{j}].cvss_v3.baseScore should be a number")
                score = float(raw_score) if raw_score is not None else None
                severity = Severity.normalize(cvss.get("baseSeverity"))
                break
        cwe = _opt(vuln, "cwe", dict, document, where) or {}
        description = ""
        for note in _opt(vuln, "notes", list, document, where) or []:
            if isinstance(note, dict) and note.get("category") in ("summary", "description"):
                description = str(note.get("text", ""))
                break
        release = vuln.get("release_date")
        cves.append(ParsedCVE(
            cve_id=cve_id, title=str(vuln.get("title", "")), description=description, cvss_vector=vector,
            base_score=score, severity=severity, cwe_id=str(cwe.get("id", "")), cwe_name=str(cwe.get("name", "")),
            release_date=_date(release, document, f"{where}.release_date") if isinstance(release, str) else None,
            affected_product_ids=tuple(affected), fixed_product_ids=tuple(fixed),
        ))
    return cves
