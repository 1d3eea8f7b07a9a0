"""Turn fetched documents into Advisory / CVE / AffectedRange rows, one transaction per document."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from advisories import csaf
from advisories.choices import EventKind, Integrity, Severity, SourceKind
from advisories.csaf import DocumentError, ParsedAdvisory, ParsedRange, UnparsedItem, version_tuple
from advisories.exposure import recompute
from advisories.models import CVE, Advisory, AdvisoryEvent, AffectedRange, SourceState
from inventory.versions import parse_version

log = logging.getLogger(__name__)


@dataclass
class FetchedDocument:
    """A CSAF document as a source delivered it."""

    name: str  # path or URL: what errors and the advisory's `source` show
    content: bytes
    source_kind: str
    published_sha256: str | None = None  # None: nothing published beside it
    validators: dict[str, str] | None = None  # {"url", "etag", "last_modified"}: saved on success


@dataclass
class IndexEntry:
    """A row of NVIDIA's JSON index: a bulletin that may have no CSAF yet."""

    name: str
    publisher_id: str
    title: str
    severity: str
    cve_ids: list[str]
    published: Any  # datetime | None
    updated: Any


@dataclass
class NotModified:
    """A conditional request answered 304: the document has not changed since the last ingest."""

    name: str


@dataclass
class IngestSummary:
    new: int = 0
    updated: int = 0
    unchanged: int = 0
    unparsed: int = 0
    integrity: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    advisory_ids: list[int] = field(default_factory=list)

    def line(self) -> str:
        integrity = ", ".join(f"{k} {v}" for k, v in sorted(self.integrity.items())) or "none"
        return (f"new {self.new}, updated {self.updated}, unchanged {self.unchanged}, unparsed {self.unparsed}, "
                f"errors {len(self.errors)}; integrity: {integrity}")


def integrity_of(parsed_sha256: str, published: str | None) -> str:
    if published is None:
        return Integrity.ABSENT
    return Integrity.MATCH if published.strip().lower() == parsed_sha256 else Integrity.MISMATCH


def ingest_documents(
    items: Iterable[FetchedDocument | IndexEntry | DocumentError | NotModified],
    progress: Callable[[str], None] | None = None,
) -> IngestSummary:
    """Ingest every item; a bad document is reported in the summary and changes nothing."""
    summary = IngestSummary()
    changed: list[int] = []
    for item in items:
        if isinstance(item, DocumentError):
            summary.errors.append(str(item))
            _reject(item)
            continue
        if isinstance(item, NotModified):
            summary.unchanged += 1
            if progress:
                progress(item.name)
            continue
        try:
            if isinstance(item, IndexEntry):
                outcome, advisory_id, unparsed, integrity = ingest_index_entry(item)
            else:
                outcome, advisory_id, unparsed, integrity = ingest_document(item, exposures=False)
        except DocumentError as exc:
            summary.errors.append(str(exc))
            _reject(exc)
            continue
        setattr(summary, outcome, getattr(summary, outcome) + 1)
        summary.unparsed += unparsed
        if integrity:
            summary.integrity[integrity] += 1
        summary.advisory_ids.append(advisory_id)
        if outcome != "unchanged" and isinstance(item, FetchedDocument):
            changed.append(advisory_id)
        if progress:
            progress(item.name)
    # One fleet-wide match for the whole batch instead of one per document, including any
    # advisory a failed earlier batch left unmatched.
    changed += Advisory.objects.filter(exposures_at__isnull=True, ranges_unknown=False).values_list("id", flat=True)
    if changed:
        recompute(advisory_ids=changed)
    return summary


def _reject(exc: DocumentError) -> None:
    log.warning("advisory document rejected: %s", exc)
    AdvisoryEvent.objects.create(kind=EventKind.REJECTED, document=exc.document[:1000], message=exc.problem)


def _key(component: str, version: str | None) -> str | None:
    if not version:
        return None
    return parse_version(component, version).key


def ingest_document(doc: FetchedDocument, exposures: bool = True) -> tuple[str, int, int, str]:
    """Ingest one CSAF document. Returns (outcome, advisory id, unparsed count, integrity).

    With `exposures` the advisory's exposures are recomputed in the same transaction; a batch
    (ingest_documents) turns that off and recomputes once for every changed advisory.
    """
    parsed = csaf.parse(doc.content, doc.name)
    integrity = integrity_of(parsed.content_sha256, doc.published_sha256)
    # Ranges whose bounds do not parse as versions join the unparsed list instead.
    ranges: list[tuple[ParsedRange, str | None, str | None]] = []
    unparsed = list(parsed.unparsed)
    for rng in parsed.ranges:
        lower, upper = _key(rng.component, rng.lower), _key(rng.component, rng.upper)
        if (rng.lower and lower is None) or (rng.upper and upper is None):
            unparsed.append(UnparsedItem(rng.product_id, rng.raw, "range bound is not a comparable version"))
            continue
        ranges.append((rng, lower, upper))
    unparsed_dicts = [u.as_dict() for u in unparsed]

    with transaction.atomic():
        existing = (
            Advisory.objects.select_for_update()
            .filter(publisher=parsed.publisher, publisher_id=parsed.publisher_id)
            .first()
        )
        if existing is not None and not existing.ranges_unknown:
            same = (existing.content_sha256 == parsed.content_sha256 and existing.integrity == integrity
                    and existing.published_sha256 == (doc.published_sha256 or ""))
            older = version_tuple(parsed.tracking_version) < version_tuple(existing.tracking_version)
            if same or older:
                _save_validators(doc)
                return "unchanged", existing.id, len(unparsed), existing.integrity
        advisory = existing or Advisory(publisher=parsed.publisher, publisher_id=parsed.publisher_id)
        outcome = "new" if existing is None else "updated"
        if existing is not None and existing.content_sha256 and existing.content_sha256 != parsed.content_sha256:
            advisory.history = [*existing.history, {
                "tracking_version": existing.tracking_version, "content_sha256": existing.content_sha256,
                "source": existing.source, "replaced_at": timezone.now().isoformat(),
            }]
        _fill(advisory, parsed, doc, integrity, unparsed_dicts)
        advisory.save()
        cves = _upsert_cves(parsed)
        advisory.cves.set(cves.values())
        _replace_ranges(advisory, parsed, ranges, cves)
        AdvisoryEvent.objects.create(
            advisory=advisory, kind=EventKind.CREATED if outcome == "new" else EventKind.UPDATED,
            document=doc.name[:1000], message=f"{advisory} {parsed.tracking_version}: {len(ranges)} ranges, "
            f"{len(cves)} CVEs, {len(unparsed)} unparsed, integrity {integrity}",
        )
        if integrity == Integrity.MISMATCH:
            AdvisoryEvent.objects.create(
                advisory=advisory, kind=EventKind.INTEGRITY_MISMATCH, document=doc.name[:1000],
                message=f"published SHA-256 {doc.published_sha256} but the document hashes to "
                f"{parsed.content_sha256}",
            )
        _save_validators(doc)
        if exposures:
            recompute(advisory_ids=[advisory.id])
    return outcome, advisory.id, len(unparsed), integrity


def _fill(advisory: Advisory, parsed: ParsedAdvisory, doc: FetchedDocument, integrity: str,
          unparsed: list[dict[str, str]]) -> None:
    advisory.title = parsed.title[:500]
    advisory.tracking_version = parsed.tracking_version
    advisory.status = parsed.status
    advisory.revision_history = parsed.revision_history
    advisory.initial_release_date = parsed.initial_release_date
    advisory.current_release_date = parsed.current_release_date
    advisory.severity = parsed.severity
    advisory.summary = parsed.summary
    advisory.source_kind = doc.source_kind
    advisory.source = doc.name[:1000]
    advisory.content_sha256 = parsed.content_sha256
    advisory.published_sha256 = doc.published_sha256 or ""
    advisory.integrity = integrity
    advisory.unparsed = unparsed
    advisory.ranges_unknown = False
    advisory.exposures_at = None


def _upsert_cves(parsed: ParsedAdvisory) -> dict[str, CVE]:
    existing = {c.cve_id: c for c in CVE.objects.filter(cve_id__in=[p.cve_id for p in parsed.cves])}
    result: dict[str, CVE] = {}
    for p in parsed.cves:
        values = {
            "description": p.description, "cvss_vector": p.cvss_vector[:200],
            "base_score": Decimal(str(p.base_score)) if p.base_score is not None else None,
            "severity": p.severity, "cwe_id": p.cwe_id[:20], "cwe_name": p.cwe_name[:300],
            "release_date": p.release_date,
        }
        cve = existing.get(p.cve_id)
        if cve is None:
            cve = CVE.objects.create(cve_id=p.cve_id, **values)
        elif any(getattr(cve, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(cve, k, v)
            cve.save()
        result[p.cve_id] = cve
    return result


def _replace_ranges(advisory: Advisory, parsed: ParsedAdvisory,
                    ranges: list[tuple[ParsedRange, str | None, str | None]], cves: dict[str, CVE]) -> None:
    """Upsert ranges by (product_id, os_family, product_line) so exposures keep their history."""
    current = {(r.product_id, r.os_family, r.product_line): r for r in advisory.ranges.all()}
    keep: set[int] = set()
    through = AffectedRange.cves.through
    links: list[Any] = []
    for rng, lower_key, upper_key in ranges:
        severity = Severity.worst([cves[c].severity for c in rng.cve_ids if c in cves]) or parsed.severity
        values: dict[str, Any] = {
            "product_name": rng.product_name[:200], "architecture": rng.architecture[:300],
            "component": rng.component, "branch": rng.branch, "raw": rng.raw[:300],
            "lower_version": rng.lower or "", "lower_key": lower_key, "lower_inclusive": rng.lower_inclusive,
            "upper_version": rng.upper or "", "upper_key": upper_key, "upper_inclusive": rng.upper_inclusive,
            "fixed_version": rng.fixed_version[:64], "severity": severity,
        }
        row = current.get((rng.product_id, rng.os_family, rng.product_line))
        if row is None:
            row = AffectedRange.objects.create(
                advisory=advisory, product_id=rng.product_id[:300], os_family=rng.os_family,
                product_line=rng.product_line, **values,
            )
        elif any(getattr(row, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(row, k, v)
            row.save()
        keep.add(row.id)
        links.extend(through(affectedrange_id=row.id, cve_id=cves[c].id) for c in rng.cve_ids if c in cves)
    advisory.ranges.exclude(id__in=keep).delete()
    through.objects.filter(affectedrange_id__in=keep).delete()
    through.objects.bulk_create(links)


def _save_validators(doc: FetchedDocument) -> None:
    v = doc.validators
    if not v:
        return
    state = SourceState.objects.filter(url=v["url"]).first()
    if state and (state.etag, state.last_modified) == (v.get("etag", ""), v.get("last_modified", "")):
        return
    SourceState.objects.update_or_create(
        url=v["url"], defaults={"etag": v.get("etag", ""), "last_modified": v.get("last_modified", "")}
    )


def ingest_index_entry(entry: IndexEntry) -> tuple[str, int, int, str]:
    """A bulletin known only from the index: flagged "affected ranges unknown"."""
    with transaction.atomic():
        existing = Advisory.objects.select_for_update().filter(publisher="NVIDIA",
                                                               publisher_id=entry.publisher_id).first()
        if existing is not None and not existing.ranges_unknown:
            return "unchanged", existing.id, 0, ""  # the CSAF is richer: keep it
        values = {
            "title": entry.title[:500], "severity": entry.severity, "initial_release_date": entry.published,
            "current_release_date": entry.updated or entry.published, "source_kind": SourceKind.INDEX,
            "source": entry.name[:1000], "ranges_unknown": True, "integrity": Integrity.ABSENT,
        }
        cve_ids = sorted(set(entry.cve_ids))
        if existing is not None:
            # Where the row came from (file, URL, row number) is not content: a mirror of the same
            # index must not count as an update.
            content = {k: v for k, v in values.items() if k not in ("source", "source_kind")}
            same = all(getattr(existing, k) == v for k, v in content.items()) and sorted(
                existing.cves.values_list("cve_id", flat=True)) == cve_ids
            if same:
                return "unchanged", existing.id, 0, ""
            advisory = existing
            for k, v in values.items():
                setattr(advisory, k, v)
            outcome = "updated"
        else:
            advisory = Advisory(publisher="NVIDIA", publisher_id=entry.publisher_id, **values)
            outcome = "new"
        advisory.save()
        known = {c.cve_id: c for c in CVE.objects.filter(cve_id__in=cve_ids)}
        for cve_id in cve_ids:
            if cve_id not in known:
                known[cve_id] = CVE.objects.create(cve_id=cve_id, severity=entry.severity)
        advisory.cves.set(known.values())
        AdvisoryEvent.objects.create(
            advisory=advisory, kind=EventKind.CREATED if outcome == "new" else EventKind.UPDATED,
            document=entry.name[:1000], message=f"{advisory} from the index: affected ranges unknown",
        )
    return outcome, advisory.id, 0, ""
