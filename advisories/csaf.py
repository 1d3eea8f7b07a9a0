"""CSAF 2.0 documents as NVIDIA publishes them, decoded into plain data (no Django).

NVIDIA encodes affected ranges in the product tree rather than in CSAF's version ranges:

    vendor NVIDIA
      product_family
        product_name  "Tesla"   linuxr580_tesla
      architecture   "Linux(R580)"
        product_version "Tesla" linuxr580_tesla_all_driver_versions_prior_to_580_95_05   (affected)
        product_version "Tesla" linuxr580_tesla_580_95_05                                 (fixed)

The architecture gives the OS and driver branch, the leaf's name the product line, and the
version text (the CPE's version field, or the product_id minus the product_name's id) the
range. Each vulnerability's `product_status.known_affected` names the leaves it applies to, so
which CVEs hit which branch is read per range. Version texts that do not decode (vGPU rows with
two labels run together, "available the week of ...") are returned as unparsed items, never
dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from advisories.choices import ComponentKind, Severity


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


@dataclass(frozen=True)
class UnparsedItem:
    product_id: str
    raw: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"product_id": self.product_id, "raw": self.raw, "reason": self.reason}


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
    unparsed: list[UnparsedItem] = field(default_factory=list)


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


def version_tuple(text: str) -> tuple[int, ...]:
    """'1.10.0' -> (1, 10, 0); non-numeric parts count as 0 (tracking versions only)."""
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.\-+]", text))


# --- version text decoding ------------------------------------------------------------------

_V = r"v?(\d+(?:_\d+)*)"
# "all_driver_versions_prior_to_580_95_05", "all_drivers_versions_prior_to_...", "all_versions_prior_to_...",
# optionally "..._for_support_of_geforce_kepler_desktop".
_PRIOR_TO = re.compile(rf"all_(?:drivers?_)?versions?_prior_to_{_V}(?P<note>_for_support_of_[a-z0-9_]+)?")
_UP_TO = re.compile(rf"all_(?:drivers?_)?versions?_up_to_and_including_{_V}")
_BETWEEN = re.compile(rf"{_V}_to_{_V}")
# vGPU / Cloud Gaming rows: the driver version with its release label run together, once.
_LABELLED_AFFECTED = re.compile(
    rf"{_V}(?P<label>all_versions_(?:prior_to_and_including|up_to_and_including)_(?:(?!all_versions)[a-z0-9_])+)"
)
_FIXED = re.compile(rf"{_V}(?P<label>vgpu_?\d+(?:_\d+)*|[a-z]+_\d{{4}}(?:_cloud_gaming)?_release)?")
_FIXED_AND = re.compile(rf"{_V}_and_{_V}(?:_latest)?")
_ALL = re.compile(r"all_(?:drivers?_)?versions?")


def _dots(match_text: str) -> str:
    return match_text.replace("_", ".")


@dataclass(frozen=True)
class _Decoded:
    kind: str  # "affected" or "fixed"
    lower: str | None = None
    lower_inclusive: bool = False
    upper: str | None = None
    upper_inclusive: bool = False
    fixed: str = ""


def decode_version_text(text: str) -> _Decoded | None:
    """Decode one NVIDIA version text; None when it does not fit a known form."""
    if m := _PRIOR_TO.fullmatch(text):
        return _Decoded("affected", upper=_dots(m.group(1)), upper_inclusive=False)
    if m := _UP_TO.fullmatch(text):
        return _Decoded("affected", upper=_dots(m.group(1)), upper_inclusive=True)
    if m := _BETWEEN.fullmatch(text):
        return _Decoded("affected", lower=_dots(m.group(1)), lower_inclusive=True,
                        upper=_dots(m.group(2)), upper_inclusive=True)
    if m := _LABELLED_AFFECTED.fullmatch(text):
        return _Decoded("affected", upper=_dots(m.group(1)), upper_inclusive=True)
    if _ALL.fullmatch(text):
        return _Decoded("affected")
    if m := _FIXED.fullmatch(text):
        return _Decoded("fixed", fixed=_dots(m.group(1)))
    if m := _FIXED_AND.fullmatch(text):
        # "2_3_4_and_2_3_5_latest": the first release that carries the fix.
        return _Decoded("fixed", fixed=_dots(m.group(1)))
    return None


# --- product classification -------------------------------------------------------------------


def classify_component(product_name: str, architecture: str) -> str:
    name = product_name.lower()
    if "container toolkit" in name:
        return ComponentKind.CONTAINER_TOOLKIT
    if "gpu operator" in name:
        return ComponentKind.GPU_OPERATOR
    if "dcgm" in name or "data center gpu manager" in name:
        return ComponentKind.DCGM
    if "triton" in name:
        return ComponentKind.TRITON
    if "dgx" in name or "dgx" in architecture.lower() or "firmware" in name:
        return ComponentKind.FIRMWARE
    if any(word in name for word in ("tesla", "geforce", "quadro", "rtx", "nvs", "studio", "guest driver",
                                      "virtual gpu manager", "cloud gaming")):
        return ComponentKind.DRIVER
    return ComponentKind.OTHER


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
    base = re.sub(r"\([^)]*\)\s*$", "", architecture).strip().lower()
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


# --- the document ---------------------------------------------------------------------------------


def _leaf_version_text(product: dict[str, Any], prefixes: list[str]) -> str | None:
    helper = product.get("product_identification_helper")
    cpe = helper.get("cpe") if isinstance(helper, dict) else None
    if isinstance(cpe, str) and cpe.startswith("cpe:2.3:"):
        parts = cpe.split(":")
        if len(parts) > 5 and parts[5] not in ("*", "-", ""):
            return parts[5]
    product_id: str = product["product_id"]
    for prefix in sorted(prefixes, key=len, reverse=True):
        if product_id.startswith(prefix + "_"):
            return product_id[len(prefix) + 1:]
    return None


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
    tracking = _req(doc, "tracking", dict, document, "document")
    publisher_id = _req(tracking, "id", str, document, "document.tracking").strip()
    if not publisher_id:
        raise DocumentError(document, "document.tracking.id is empty")
    tracking_version = _req(tracking, "version", str, document, "document.tracking")
    initial = _date(_req(tracking, "initial_release_date", str, document, "document.tracking"), document,
                    "document.tracking.initial_release_date")
    current = _date(_req(tracking, "current_release_date", str, document, "document.tracking"), document,
                    "document.tracking.current_release_date")
    history_raw = _req(tracking, "revision_history", list, document, "document.tracking")
    history: list[dict[str, str]] = []
    for i, entry in enumerate(history_raw):
        where = f"document.tracking.revision_history[{i}]"
        history.append({
            "number": _req(entry, "number", str, document, where),
            "date": _req(entry, "date", str, document, where),
            "summary": _req(entry, "summary", str, document, where),
        })
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
    affected_by: dict[str, list[str]] = {}
    for cve in cves:
        for pid in cve.affected_product_ids:
            affected_by.setdefault(pid, []).append(cve.cve_id)
    ranges, unparsed = _ranges(leaves, affected_by)
    known = {leaf.product_id for leaf in leaves}
    for cve in cves:
        for pid in cve.affected_product_ids:
            if pid not in known:
                unparsed.append(UnparsedItem(pid, pid, f"{cve.cve_id} names a product that is not a product_version"))
    parsed.ranges = ranges
    parsed.unparsed = unparsed
    return parsed


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
                            _leaf_version_text(product, prefixes)))
    return leaves


def _ranges(leaves: list[_Leaf], affected_by: dict[str, list[str]]) -> tuple[list[ParsedRange], list[UnparsedItem]]:
    ranges: list[ParsedRange] = []
    unparsed: list[UnparsedItem] = []
    groups: dict[tuple[int, str], list[tuple[_Leaf, _Decoded | None]]] = {}
    for leaf in leaves:
        decoded = decode_version_text(leaf.text) if leaf.text else None
        if decoded is None:
            unparsed.append(UnparsedItem(leaf.product_id, leaf.text or leaf.product_id,
                                         f"version text not understood ({leaf.architecture} / {leaf.name})"))
        groups.setdefault(leaf.group, []).append((leaf, decoded))
    for rows in groups.values():
        for index, (leaf, decoded) in enumerate(rows):
            if decoded is None or decoded.kind != "affected":
                continue
            # The fixed row follows its affected row; failing that, the one before it.
            after = [(lf, d) for lf, d in rows[index + 1:] if d is not None and d.kind == "fixed"]
            before = [(lf, d) for lf, d in rows[:index] if d is not None and d.kind == "fixed"]
            fixed_leaf, fixed = (after[0] if after else before[-1]) if (after or before) else (None, None)
            fixed_version = fixed.fixed if fixed else (decoded.upper if not decoded.upper_inclusive else "") or ""
            upper, upper_inclusive = decoded.upper, decoded.upper_inclusive
            if upper is None and decoded.lower is None:
                if not fixed_version:
                    unparsed.append(UnparsedItem(leaf.product_id, leaf.text or "",
                                                 "affects all versions and names no fixed version"))
                    continue
                upper, upper_inclusive = fixed_version, False
            component = classify_component(leaf.name, leaf.architecture)
            lines = classify_product_lines(leaf.name, leaf.architecture) if component == ComponentKind.DRIVER else [""]
            branch = driver_branch(leaf.architecture) if component == ComponentKind.DRIVER else ""
            for line in lines:
                for os_family in classify_os(leaf.architecture, line):
                    ranges.append(ParsedRange(
                        product_id=leaf.product_id, product_name=leaf.name, component=component,
                        os_family=os_family, branch=branch, product_line=line, architecture=leaf.architecture,
                        raw=leaf.text or "", lower=decoded.lower, lower_inclusive=decoded.lower_inclusive,
                        upper=upper, upper_inclusive=upper_inclusive, fixed_version=fixed_version,
                        fixed_product_id=fixed_leaf.product_id if fixed_leaf else "",
                        cve_ids=tuple(sorted(set(affected_by.get(leaf.product_id, [])))),
                    ))
    return ranges, unparsed


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
