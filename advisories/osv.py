"""Distribution advisories: OSV records (schema 1.x: Ubuntu USN, Debian, AlmaLinux, Rocky ...) and
Canonical's Livepatch notices (LSN, Canonical's own JSON), read into the ParsedAdvisory that
advisories.ingest stores for CSAF, so both share its integrity, idempotence and rejection rules.

An OSV `affected` entry names a *source* package in an ecosystem ("Ubuntu:22.04:LTS") with
ECOSYSTEM ranges in that distribution's version order (advisories.distro_versions). Each
interval becomes one AffectedRange of component OS_PACKAGE: its bounds stay text in `scope`
(no sort key orders dpkg versions), the binaries built from the source in `condition`. They are
matched on package sets by advisories.osmatch, never by the SQL matching of NVIDIA's ranges.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from typing import Any

from advisories import cvss, distro_versions
from advisories.choices import ReviewKind, Severity
from advisories.csaf import DocumentError, ParsedAdvisory, ParsedCVE, ParsedRange, ReviewNote

OS_PACKAGE = "os_package"
OS_LIVEPATCH = "os_livepatch"
OS_COMPONENTS = (OS_PACKAGE, OS_LIVEPATCH)

_CVE = re.compile(r"CVE-\d{4}-\d{4,}")
# Ubuntu's priorities; "negligible" is below low, "untriaged" says nothing yet.
_PRIORITY = {"critical": Severity.CRITICAL, "high": Severity.HIGH, "medium": Severity.MEDIUM,
             "low": Severity.LOW, "negligible": Severity.LOW}


def is_osv(data: Any) -> bool:
    return isinstance(data, dict) and "schema_version" in data and "id" in data and "csaf_version" not in data


def is_lsn(data: Any) -> bool:
    return (isinstance(data, dict) and str(data.get("id", "")).startswith("LSN-")
            and isinstance(data.get("releases"), dict))


def looks_like(content: bytes) -> bool:
    """Cheap test before a full parse: an OSV record or an LSN, not a CSAF document."""
    head = content[:4096]
    return b'"csaf_version"' not in content and (b'"schema_version"' in head or b'"LSN-' in content[:65536])


def _load(content: bytes, document: str) -> Any:
    try:
        return json.loads(content)
    except UnicodeDecodeError as exc:
        raise DocumentError(document, f"not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise DocumentError(document, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def _text(obj: dict[str, Any], key: str, document: str, where: str, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise DocumentError(document, f"{where}.{key} should be non-empty text, got {value!r:.60}")
    return value


def _when(value: str, document: str, where: str) -> dt.datetime:
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise DocumentError(document, f"{where} {value!r} is not an RFC 3339 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def parse(content: bytes, document: str) -> ParsedAdvisory:
    """An OSV record or an LSN; DocumentError names what is wrong (nothing is stored then)."""
    data = _load(content, document)
    if is_lsn(data):
        return parse_lsn(data, content, document)
    if not is_osv(data):
        raise DocumentError(document, "neither an OSV record (schema_version, id) nor a Livepatch notice")
    schema = _text(data, "schema_version", document, "$")
    if not schema.startswith("1."):
        raise DocumentError(document, f"OSV schema_version {schema!r} is not supported (1.x is)")
    osv_id = _text(data, "id", document, "$").strip()
    modified_text = _text(data, "modified", document, "$")
    modified = _when(modified_text, document, "modified")
    published = _when(data["published"], document, "published") if isinstance(data.get("published"), str) else None
    affected = data.get("affected") or []
    if not isinstance(affected, list):
        raise DocumentError(document, "affected should be a list")
    cves = _cves(data, document)
    parsed = ParsedAdvisory(
        publisher=_publisher(osv_id, affected), publisher_id=osv_id[:50],
        title=(data.get("summary") or osv_id)[:500] if isinstance(data.get("summary"), str) else osv_id,
        tracking_version=modified_text[:30], status="withdrawn" if data.get("withdrawn") else "final",
        initial_release_date=published or modified, current_release_date=modified, revision_history=[],
        severity=Severity.worst([c.severity for c in cves]) or _severity(data.get("severity"), document, "severity"),
        summary=str(data.get("details") or ""), content_sha256=hashlib.sha256(content).hexdigest(), cves=cves,
    )
    cve_ids = tuple(c.cve_id for c in cves)
    for i, entry in enumerate(affected):
        _read_affected(parsed, entry, cve_ids, document, f"affected[{i}]")
    return parsed


def _publisher(osv_id: str, affected: list[Any]) -> str:
    for entry in affected:
        if isinstance(entry, dict) and isinstance(entry.get("package"), dict):
            ecosystem = str(entry["package"].get("ecosystem") or "")
            if ecosystem:
                return ecosystem.split(":", 1)[0][:50]
    return osv_id.split("-", 1)[0][:50] or "OSV"


def _severity(entries: Any, document: str, where: str) -> str:
    """The worst of OSV `severity` entries: CVSS v3 vectors scored, a distribution's priority."""
    if entries in (None, []):
        return ""
    if not isinstance(entries, list):
        raise DocumentError(document, f"{where} should be a list")
    found: list[str] = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("score"), str):
            raise DocumentError(document, f"{where} entries need a type and a score")
        kind, score = str(entry.get("type", "")), entry["score"]
        if kind.startswith("CVSS_V3"):
            base = cvss.base_score(score)
            if base is not None:
                found.append(Severity.normalize(cvss.severity(base)))
        elif score.lower() in _PRIORITY:
            found.append(_PRIORITY[score.lower()])
    return Severity.worst(found)


def _cves(data: dict[str, Any], document: str) -> list[ParsedCVE]:
    """CVE ids from id, aliases and upstream ("UBUNTU-CVE-2024-56672"); severities from
    database_specific.cves_map (Ubuntu) or the record's own severity."""
    names = [data.get("id", ""), *(data.get("aliases") or []), *(data.get("upstream") or [])]
    ids = sorted({m for name in names if isinstance(name, str) for m in _CVE.findall(name)})
    per_cve: dict[str, list[Any]] = {}
    cves_map = ((data.get("database_specific") or {}).get("cves_map") or {}) if isinstance(
        data.get("database_specific"), dict) else {}
    for entry in data.get("affected") or []:
        if isinstance(entry, dict) and isinstance(entry.get("database_specific"), dict):
            cves_map = cves_map or entry["database_specific"].get("cves_map") or {}
    for item in cves_map.get("cves") or [] if isinstance(cves_map, dict) else []:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            per_cve[item["id"]] = item.get("severity") or []
    record_severity = _severity(data.get("severity"), document, "severity")
    out = []
    for cve_id in ids:
        entries = per_cve.get(cve_id, [])
        vectors = [e["score"] for e in entries if isinstance(e, dict) and str(e.get("type", "")).startswith("CVSS_V3")
                   and isinstance(e.get("score"), str)]
        base = cvss.base_score(vectors[0]) if vectors else None
        out.append(ParsedCVE(
            cve_id=cve_id, title="", description="", cvss_vector=vectors[0] if vectors else "", base_score=base,
            severity=_severity(entries, document, f"cves_map {cve_id}") or record_severity, cwe_id="", cwe_name="",
            release_date=None, affected_product_ids=(), fixed_product_ids=()))
    return out


def _read_affected(parsed: ParsedAdvisory, entry: Any, cve_ids: tuple[str, ...], document: str, where: str) -> None:
    if not isinstance(entry, dict) or not isinstance(entry.get("package"), dict):
        raise DocumentError(document, f"{where}.package should be an object")
    ecosystem = _text(entry["package"], "ecosystem", document, f"{where}.package")
    name = _text(entry["package"], "name", document, f"{where}.package")
    binaries = _binaries(entry.get("ecosystem_specific"), document, where)
    order = distro_versions.order_of(ecosystem)
    ranges = entry.get("ranges") or []
    if not isinstance(ranges, list):
        raise DocumentError(document, f"{where}.ranges should be a list")
    key = f"{ecosystem}/{name}"
    if order is None:
        parsed.review.append(ReviewNote(key, ReviewKind.UNPARSED_ROW, key,
                                        f"ecosystem {ecosystem} has no version order gpusweep knows"))
        return
    n = 0
    for j, rng in enumerate(ranges):
        if not isinstance(rng, dict) or not isinstance(rng.get("events"), list):
            raise DocumentError(document, f"{where}.ranges[{j}] needs a list of events")
        if rng.get("type") != "ECOSYSTEM":
            parsed.review.append(ReviewNote(f"{key}#{j}", ReviewKind.UNPARSED_ROW, str(rng.get("type")),
                                            "only ECOSYSTEM ranges are matched against installed packages"))
            continue
        for interval in _intervals(rng["events"], order, document, f"{where}.ranges[{j}]"):
            n += 1
            parsed.ranges.append(_range(key if n == 1 else f"{key}#{n}", ecosystem, name, interval, binaries,
                                        cve_ids))


def _binaries(specific: Any, document: str, where: str) -> list[str]:
    if specific is None:
        return []
    if not isinstance(specific, dict) or not isinstance(specific.get("binaries", []), list):
        raise DocumentError(document, f"{where}.ecosystem_specific.binaries should be a list")
    names = []
    for b in specific.get("binaries", []):
        name = b.get("binary_name") if isinstance(b, dict) else b
        if not isinstance(name, str) or not name:
            raise DocumentError(document, f"{where}.ecosystem_specific.binaries: {b!r:.60} names no binary")
        names.append(name)
    return sorted(set(names))


def _intervals(events: list[Any], order: str, document: str, where: str) -> list[dict[str, str]]:
    """OSV events in order: each `introduced` opens an interval that `fixed` or `last_affected` closes."""
    out: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for k, event in enumerate(events):
        if not isinstance(event, dict) or len(event) != 1:
            raise DocumentError(document, f"{where}.events[{k}] should hold exactly one of introduced, fixed, "
                                "last_affected, limit")
        (kind, version), = event.items()
        if kind not in ("introduced", "fixed", "last_affected", "limit") or not isinstance(version, str):
            raise DocumentError(document, f"{where}.events[{k}]: unknown event {kind!r}")
        if version != "0" and not distro_versions.is_valid(order, version):
            raise DocumentError(document, f"{where}.events[{k}].{kind} {version!r} is not a {order} version")
        if kind == "introduced":
            current = {"introduced": version}
            out.append(current)
        elif kind in ("fixed", "last_affected"):
            if current is None:
                current = {"introduced": "0"}
                out.append(current)
            current[kind] = version
            current = None
    return out


def _range(product_id: str, ecosystem: str, name: str, interval: dict[str, str], binaries: list[str],
           cve_ids: tuple[str, ...]) -> ParsedRange:
    fixed = interval.get("fixed", "")
    last = interval.get("last_affected", "")
    bound = f"< {fixed}" if fixed else (f"<= {last}" if last else "every version")
    kernel = name.startswith("linux") and any(b.startswith(("linux-image", "linux-modules")) for b in binaries)
    return ParsedRange(
        product_id=product_id[:300], product_name=name[:200], component=OS_PACKAGE, os_family="linux", branch="",
        product_line="", architecture="", raw=f"{ecosystem} {name} {bound}"[:300], lower=None,
        lower_inclusive=True, upper=None, upper_inclusive=False, fixed_version=fixed[:64], fixed_product_id="",
        cve_ids=cve_ids,
        scope={"ecosystem": ecosystem, "package": name, "introduced": interval.get("introduced", "0"),
               "fixed": fixed, "last_affected": last, "kernel": "1" if kernel else ""},
        condition={"binaries": binaries}, remediation=f"update {name} to {fixed}" if fixed else "",
    )


def parse_lsn(data: dict[str, Any], content: bytes, document: str) -> ParsedAdvisory:
    """A Livepatch notice: per release codename and kernel flavour, the base kernel the livepatch
    covers, its module name pattern and the livepatch version that fixes the notice's CVEs."""
    lsn_id = _text(data, "id", document, "$")
    if not isinstance(data.get("cves"), list) or not all(isinstance(c, str) for c in data["cves"]):
        raise DocumentError(document, "cves should be a list of CVE ids")
    cve_ids = tuple(sorted({m for c in data["cves"] for m in _CVE.findall(c)}))
    stamp = data.get("timestamp")
    if not isinstance(stamp, int | float):
        raise DocumentError(document, "timestamp should be a number (seconds since 1970)")
    when = dt.datetime.fromtimestamp(stamp, dt.UTC)
    parsed = ParsedAdvisory(
        publisher="Ubuntu", publisher_id=lsn_id[:50], title=str(data.get("isummary") or data.get("title") or lsn_id),
        tracking_version=when.strftime("%Y-%m-%dT%H:%M:%SZ"), status="final", initial_release_date=when,
        current_release_date=when, revision_history=[], severity="", summary=str(data.get("description") or ""),
        content_sha256=hashlib.sha256(content).hexdigest(),
        cves=[ParsedCVE(c, "", "", "", None, "", "", "", None, (), ()) for c in cve_ids],
    )
    for codename, release in sorted(data["releases"].items()):
        if not isinstance(release, dict) or not isinstance(release.get("sources", {}), dict):
            raise DocumentError(document, f"releases.{codename} should hold sources")
        patches = release.get("allbinaries") or {}
        for flavour, source in sorted(release.get("sources", {}).items()):
            patch = patches.get(flavour) if isinstance(patches, dict) else None
            if (not isinstance(source, dict) or not isinstance(patch, dict)
                    or not str(patch.get("version", "")).isdigit()):
                raise DocumentError(document, f"releases.{codename}.{flavour}: needs a kernel version and a "
                                    "livepatch version in allbinaries")
            parsed.ranges.append(ParsedRange(
                product_id=f"{codename}/{flavour}"[:300], product_name=f"livepatch {flavour}"[:200],
                component=OS_LIVEPATCH, os_family="linux", branch="", product_line="", architecture="",
                raw=f"{codename} {flavour} from {source.get('version', '')}"[:300], lower=None, lower_inclusive=True,
                upper=None, upper_inclusive=False, fixed_version=str(patch["version"]), fixed_product_id="",
                cve_ids=cve_ids,
                scope={"codename": codename, "flavour": flavour, "kernel": str(source.get("version", "")),
                       "module": str(patch.get("module", "")), "livepatch_version": str(patch["version"])},
                remediation=f"livepatch version {patch['version']}",
            ))
    return parsed
