"""Turn fetched documents into Advisory / CVE / AffectedRange rows, one transaction per document."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from advisories import bounds, csaf, osv
from advisories.choices import (
    EventKind,
    ExposureState,
    Integrity,
    RangeBasis,
    ReviewState,
    Severity,
    SourceKind,
)
from advisories.csaf import DocumentError, ParsedAdvisory, ParsedRange, ReviewNote, version_tuple
from advisories.exposure import recompute
from advisories.models import CVE, Advisory, AdvisoryEvent, AffectedRange, Exposure, ReviewItem, SourceState
from advisories.osmatch import os_scope, recompute_os, vendor_scope
from advisories.signals import announce_matched

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
    """A bulletin from one of NVIDIA's indexes (the JSON index, the CVE index CSV): it may have no
    CSAF yet. `products` are the CVE index's rows, kept as review items while no CSAF decodes them."""

    name: str
    publisher_id: str
    title: str
    severity: str
    cve_ids: list[str]
    published: Any  # datetime | None
    updated: Any
    document: str = ""  # the index file or URL the entry came from (the summary's line)
    products: list[ReviewNote] = field(default_factory=list)


@dataclass
class Skipped:
    """A file a source names but does not ingest, with why: the summary shows it."""

    name: str
    reason: str


@dataclass
class NotModified:
    """A conditional request answered 304: the document has not changed since the last ingest."""

    name: str


@dataclass
class IngestSummary:
    new: int = 0
    updated: int = 0
    unchanged: int = 0
    review: int = 0  # open review items of the documents read
    integrity: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    advisory_ids: list[int] = field(default_factory=list)
    # Per document (path or URL): what became of it ("new 5703 1.0.0", "skipped: ...", "rejected: ...").
    outcomes: dict[str, list[str]] = field(default_factory=dict)

    def line(self) -> str:
        integrity = ", ".join(f"{k} {v}" for k, v in sorted(self.integrity.items())) or "none"
        return (f"new {self.new}, updated {self.updated}, unchanged {self.unchanged}, needs review {self.review}, "
                f"errors {len(self.errors)}; integrity: {integrity}")

    def note(self, document: str, outcome: str) -> None:
        self.outcomes.setdefault(document, []).append(outcome)

    def merge(self, other: IngestSummary) -> None:
        self.new += other.new
        self.updated += other.updated
        self.unchanged += other.unchanged
        self.review += other.review
        self.integrity.update(other.integrity)
        self.errors += other.errors
        self.advisory_ids += other.advisory_ids
        for document, outcomes in other.outcomes.items():
            self.outcomes.setdefault(document, []).extend(outcomes)

    def document_lines(self) -> list[str]:
        """One line per document; an index's many bulletins are counted, not listed."""
        lines = []
        for document, outcomes in self.outcomes.items():
            if len(outcomes) == 1:
                lines.append(f"{document}: {outcomes[0]}")
            else:
                counts = Counter(o.split(" ", 1)[0] for o in outcomes)
                lines.append(f"{document}: {len(outcomes)} bulletins: "
                             + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        return lines


def integrity_of(parsed_sha256: str, published: str | None) -> str:
    if published is None:
        return Integrity.ABSENT
    return Integrity.MATCH if published.strip().lower() == parsed_sha256 else Integrity.MISMATCH


def ingest_documents(
    items: Iterable[FetchedDocument | IndexEntry | DocumentError | NotModified | Skipped],
    progress: Callable[[str], None] | None = None,
) -> IngestSummary:
    """Ingest every item; a bad document is reported in the summary and changes nothing."""
    summary = IngestSummary()
    changed: list[int] = []
    created: list[int] = []  # new advisories: none of their ranges has an exposure yet
    for item in items:
        if isinstance(item, DocumentError):
            summary.errors.append(str(item))
            summary.note(item.document, f"rejected: {item.problem}")
            _reject(item)
            continue
        if isinstance(item, Skipped):
            summary.note(item.name, f"skipped: {item.reason}")
            continue
        if isinstance(item, NotModified):
            summary.unchanged += 1
            summary.note(item.name, "unchanged (not modified)")
            if progress:
                progress(item.name)
            continue
        try:
            if isinstance(item, IndexEntry):
                outcome, advisory_id, review, integrity = ingest_index_entry(item)
            else:
                outcome, advisory_id, review, integrity = ingest_document(item, exposures=False)
        except DocumentError as exc:
            summary.errors.append(str(exc))
            summary.note(exc.document, f"rejected: {exc.problem}")
            _reject(exc)
            continue
        setattr(summary, outcome, getattr(summary, outcome) + 1)
        summary.review += review
        if integrity:
            summary.integrity[integrity] += 1
        summary.advisory_ids.append(advisory_id)
        document = item.document or item.name if isinstance(item, IndexEntry) else item.name
        summary.note(document, f"{outcome} {item.publisher_id if isinstance(item, IndexEntry) else ''}".strip()
                     + (f" ({review} to review)" if review else ""))
        if outcome != "unchanged" and isinstance(item, FetchedDocument):
            changed.append(advisory_id)
            if outcome == "new":
                created.append(advisory_id)
        if progress:
            progress(item.name)
    # One fleet-wide match for the whole batch instead of one per document, including any
    # advisory a failed earlier batch left unmatched.
    changed += Advisory.objects.filter(exposures_at__isnull=True, ranges_unknown=False).values_list("id", flat=True)
    changed = list(dict.fromkeys(changed))  # an advisory of this batch is also one not matched yet
    if changed:
        if vendor := vendor_scope(changed):
            recompute(advisory_ids=vendor, fresh=created)
        recompute_os(advisory_ids=os_scope(changed), fresh=created)
        announce_matched(changed)
    return summary


def _reject(exc: DocumentError) -> None:
    log.warning("advisory document rejected: %s", exc)
    AdvisoryEvent.objects.create(kind=EventKind.REJECTED, document=exc.document[:1000], message=exc.problem)


def ingest_document(doc: FetchedDocument, exposures: bool = True) -> tuple[str, int, int, str]:
    """Ingest one CSAF document. Returns (outcome, advisory id, open review items, integrity).

    With `exposures` the advisory's exposures are recomputed in the same transaction; a batch
    (ingest_documents) turns that off and recomputes once for every changed advisory.
    """
    bounds.check(doc.content, doc.name)  # before the parser: too deep or too big is one bad document
    parsed = parse_document(doc)
    integrity = integrity_of(parsed.content_sha256, doc.published_sha256)
    ranges, notes = _keyed_ranges(parsed)

    with transaction.atomic():
        existing = (
            Advisory.objects.select_for_update()
            .filter(publisher=parsed.publisher, publisher_id=parsed.publisher_id)
            .first()
        )
        if existing is not None and not existing.ranges_unknown:
            same = (existing.content_sha256 == parsed.content_sha256 and existing.integrity == integrity
                    and existing.published_sha256 == (doc.published_sha256 or ""))
            older = _older(parsed.tracking_version, existing.tracking_version)
            if same or older:
                if same and parsed.rows and not existing.product_rows:
                    # Stored before the rows were kept: the coverage counts its rows from now on.
                    existing.product_rows, existing.read_rows = _rows_of(parsed)
                    existing.save(update_fields=["product_rows", "read_rows"])
                _save_validators(doc)
                return "unchanged", existing.id, _open_review(existing), existing.integrity
        advisory = existing or Advisory(publisher=parsed.publisher, publisher_id=parsed.publisher_id)
        outcome = "new" if existing is None else "updated"
        if existing is not None and existing.content_sha256 and existing.content_sha256 != parsed.content_sha256:
            advisory.history = [*existing.history, {
                "tracking_version": existing.tracking_version, "content_sha256": existing.content_sha256,
                "source": existing.source, "replaced_at": timezone.now().isoformat(),
            }]
        _fill(advisory, parsed, doc, integrity)
        advisory.save()
        # A distribution's record does not overwrite what the vendor's bulletin says of a CVE.
        cves = _upsert_cves(parsed, fill_only=osv.looks_like(doc.content))
        advisory.cves.set(cves.values())
        _replace_review(advisory, notes)
        _replace_ranges(advisory, parsed, _with_mappings(advisory, ranges), cves)
        review = _open_review(advisory)
        AdvisoryEvent.objects.create(
            advisory=advisory, kind=EventKind.CREATED if outcome == "new" else EventKind.UPDATED,
            document=doc.name[:1000], message=f"{advisory} {parsed.tracking_version}: {len(ranges)} ranges, "
            f"{len(cves)} CVEs, {review} to review, integrity {integrity}",
        )
        if integrity == Integrity.MISMATCH:
            AdvisoryEvent.objects.create(
                advisory=advisory, kind=EventKind.INTEGRITY_MISMATCH, document=doc.name[:1000],
                message=f"published SHA-256 {doc.published_sha256} but the document hashes to "
                f"{parsed.content_sha256}",
            )
        _save_validators(doc)
        if exposures:
            if vendor_scope([advisory.id]):
                recompute(advisory_ids=[advisory.id], fresh=[advisory.id] if outcome == "new" else [])
            recompute_os(advisory_ids=os_scope([advisory.id]))
            announce_matched([advisory.id])
    return outcome, advisory.id, review, integrity


def parse_document(doc: FetchedDocument) -> ParsedAdvisory:
    """A CSAF document, or a distribution's OSV record or Livepatch notice (advisories.osv)."""
    if osv.looks_like(doc.content):
        return osv.parse(doc.content, doc.name)
    return csaf.parse(doc.content, doc.name)


_RFC3339 = r"\d{4}-\d\d-\d\dT"


def _older(new: str, old: str) -> bool:
    """CSAF tracking versions in their order; OSV's `modified` times (UTC, RFC 3339) as text."""
    if re.match(_RFC3339, new) and re.match(_RFC3339, old):
        return new < old
    return version_tuple(new) < version_tuple(old)


RangeRow = tuple[ParsedRange, str | None, str | None]


def _keyed_ranges(parsed: ParsedAdvisory) -> tuple[list[RangeRow], list[ReviewNote]]:
    """Ranges with their bounds as sort keys. A bound that is no comparable version makes its
    row a review item and its range presumed: the parser decides that (`csaf.comparable_bounds`),
    so the coverage of a parsed document is the stored one; applied here too for any other parser."""
    notes = list(parsed.review)
    ranges = csaf.comparable_bounds(parsed.ranges, notes)
    return [(rng, csaf.bound_key(rng.component, rng.lower), csaf.bound_key(rng.component, rng.upper))
            for rng in ranges], notes


def _open_review(advisory: Advisory) -> int:
    return advisory.review_items.filter(state=ReviewState.OPEN).count()


def _replace_review(advisory: Advisory, notes: list[ReviewNote]) -> None:
    """Review items follow the document; an item already resolved keeps its resolution."""
    current = {item.key: item for item in advisory.review_items.all()}
    wanted: dict[str, ReviewNote] = {}
    for note in notes:
        wanted.setdefault(note.key[:300], note)
    new: list[ReviewItem] = []
    for key, note in wanted.items():
        values = {"kind": note.kind, "raw": note.raw[:500], "reason": note.reason, "component": note.component[:63]}
        item = current.get(key)
        if item is None:
            new.append(ReviewItem(advisory=advisory, key=key, **values))
        elif any(getattr(item, k) != v for k, v in values.items()):
            ReviewItem.objects.filter(pk=item.pk).update(**values)
    ReviewItem.objects.bulk_create(new)
    advisory.review_items.exclude(key__in=list(wanted)).delete()


def _with_mappings(advisory: Advisory, ranges: list[RangeRow]) -> list[RangeRow]:
    """An admin's mapping of a review item replaces what the parser made of that row."""
    mapped = {item.key: item for item in advisory.review_items.filter(state=ReviewState.MAPPED)}
    if not mapped:
        return ranges
    out = [row for row in ranges if row[0].product_id not in mapped]
    template = {row[0].product_id: row[0] for row in ranges}
    for key, item in mapped.items():
        out.append(mapped_range(key, item.mapping, template.get(key)))
    return out


def mapped_range(key: str, mapping: dict[str, Any], template: ParsedRange | None) -> RangeRow:
    """The range an admin's mapping describes (keys as ReviewItem.mapping), with its sort keys."""
    component = str(mapping["component"])
    lower, upper = mapping.get("lower") or None, mapping.get("upper") or None
    rng = ParsedRange(
        product_id=key, product_name=template.product_name if template else str(mapping.get("product_name", "")),
        component=component, os_family=str(mapping.get("os_family", "")), branch=str(mapping.get("branch", "")),
        product_line=str(mapping.get("product_line", "")),
        architecture=template.architecture if template else "", raw=template.raw if template else key,
        lower=lower, lower_inclusive=bool(mapping.get("lower_inclusive", True)), upper=upper,
        upper_inclusive=bool(mapping.get("upper_inclusive", False)),
        fixed_version=str(mapping.get("fixed_version", "")), fixed_product_id="",
        cve_ids=template.cve_ids if template else tuple(mapping.get("cve_ids", ())), basis=RangeBasis.MAPPED,
        scope=dict(mapping.get("scope") or {}), condition=dict(mapping.get("condition") or {}),
        remediation=f"update to {mapping['fixed_version']}" if mapping.get("fixed_version") else "",
    )
    return rng, csaf.bound_key(component, lower), csaf.bound_key(component, upper)


def _fill(advisory: Advisory, parsed: ParsedAdvisory, doc: FetchedDocument, integrity: str) -> None:
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
    advisory.ranges_unknown = False
    advisory.exposures_at = None
    advisory.product_rows, advisory.read_rows = _rows_of(parsed)


def _rows_of(parsed: ParsedAdvisory) -> tuple[dict[str, str], list[str]]:
    """The document's product rows and those that decoded, keyed as ranges and review items are."""
    return {pid[:300]: text for pid, text in parsed.rows.items()}, sorted({pid[:300] for pid in parsed.read_rows})


def _upsert_cves(parsed: ParsedAdvisory, fill_only: bool = False) -> dict[str, CVE]:
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
        elif fill_only:
            missing = {k: v for k, v in values.items() if v not in ("", None) and getattr(cve, k) in ("", None)}
            if missing:
                CVE.objects.filter(pk=cve.pk).update(**missing)
        elif any(getattr(cve, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(cve, k, v)
            cve.save()
        result[p.cve_id] = cve
    return result


def _replace_ranges(advisory: Advisory, parsed: ParsedAdvisory, ranges: list[RangeRow], cves: dict[str, CVE]) -> None:
    """Upsert ranges by (product_id, os_family, product_line) so exposures keep their history.

    A row that was presumed (undecoded, a skipped branch) and is decoded now withdraws its
    presumed exposures, with an event: the next match opens those still inside it.
    """
    current = {(r.product_id, r.os_family, r.product_line): r for r in advisory.ranges.all()}
    keep: set[int] = set()
    withdrawn: list[int] = []
    through = AffectedRange.cves.through
    links: list[Any] = []
    created: list[tuple[AffectedRange, ParsedRange]] = []
    for rng, lower_key, upper_key in ranges:
        severity = Severity.worst([cves[c].severity for c in rng.cve_ids if c in cves]) or parsed.severity
        values: dict[str, Any] = {
            "product_name": rng.product_name[:200], "architecture": rng.architecture[:300],
            "component": rng.component, "branch": rng.branch, "raw": rng.raw[:300],
            "lower_version": rng.lower or "", "lower_key": lower_key, "lower_inclusive": rng.lower_inclusive,
            "upper_version": rng.upper or "", "upper_key": upper_key, "upper_inclusive": rng.upper_inclusive,
            "fixed_version": rng.fixed_version[:64], "severity": severity, "basis": rng.basis,
            "scope": rng.scope, "condition": rng.condition, "remediation": rng.remediation[:300],
        }
        row = current.get((rng.product_id[:300], rng.os_family, rng.product_line))
        if row is None:
            created.append((AffectedRange(advisory=advisory, product_id=rng.product_id[:300], os_family=rng.os_family,
                                          product_line=rng.product_line, **values), rng))
            continue
        if any(getattr(row, k) != v for k, v in values.items()):
            if row.basis in RangeBasis.PRESUMED and rng.basis not in RangeBasis.PRESUMED:
                withdrawn.append(row.id)
            for k, v in values.items():
                setattr(row, k, v)
            row.save()
        keep.add(row.id)
        links.extend(through(affectedrange_id=row.id, cve_id=cves[c].id) for c in rng.cve_ids if c in cves)
    # New rows in one statement: a bulletin has dozens (bulk_create sets their ids).
    for row, rng in zip(AffectedRange.objects.bulk_create([row for row, _rng in created]),
                        (rng for _row, rng in created), strict=True):
        keep.add(row.id)
        links.extend(through(affectedrange_id=row.id, cve_id=cves[c].id) for c in rng.cve_ids if c in cves)
    advisory.ranges.exclude(id__in=keep).delete()
    through.objects.filter(affectedrange_id__in=keep).delete()
    through.objects.bulk_create(links, ignore_conflicts=True)
    withdraw_presumed(advisory, withdrawn, "the row is decoded now")


def withdraw_presumed(advisory: Advisory, range_ids: list[int], why: str, user: Any = None) -> int:
    """Drop the presumed exposures of ranges that are no longer presumed, with an event."""
    if not range_ids:
        return 0
    gone, _ = Exposure.objects.filter(affected_range_id__in=range_ids, state=ExposureState.PRESUMED).delete()
    if gone:
        AdvisoryEvent.objects.create(advisory=advisory, kind=EventKind.PRESUMED_WITHDRAWN, user=user,
                                     message=f"{gone} presumed exposure(s) withdrawn: {why}",
                                     details={"ranges": range_ids, "withdrawn": gone})
    return gone


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
    """A bulletin known only from an index: flagged "affected ranges unknown", its products to review."""
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
            # Both indexes may name a bulletin: each adds what it knows (the CVE index has no title,
            # the JSON index no products), so only what this entry says is compared.
            content = {k: v for k, v in values.items() if k not in ("source", "source_kind") and v not in ("", None)}
            same = (all(getattr(existing, k) == v for k, v in content.items())
                    and set(cve_ids) <= set(existing.cves.values_list("cve_id", flat=True))
                    and {n.key[:300] for n in entry.products}
                    <= set(existing.review_items.values_list("key", flat=True)))
            if same:
                return "unchanged", existing.id, _open_review(existing), ""
            advisory = existing
            for k, v in values.items():
                if v not in ("", None) or k in ("source", "source_kind"):
                    setattr(advisory, k, v)
            outcome = "updated"
        else:
            advisory = Advisory(publisher="NVIDIA", publisher_id=entry.publisher_id, **values)
            outcome = "new"
        advisory.save()
        known = set(CVE.objects.filter(cve_id__in=cve_ids).values_list("cve_id", flat=True))
        CVE.objects.bulk_create([CVE(cve_id=c, severity=entry.severity) for c in cve_ids if c not in known])
        advisory.cves.add(*CVE.objects.filter(cve_id__in=cve_ids).values_list("id", flat=True))
        if entry.products:
            current = set(advisory.review_items.values_list("key", flat=True)) if existing is not None else set()
            ReviewItem.objects.bulk_create([
                ReviewItem(advisory=advisory, key=n.key[:300], kind=n.kind, raw=n.raw[:500], reason=n.reason,
                           component=n.component[:63]) for n in entry.products if n.key[:300] not in current])
        AdvisoryEvent.objects.create(
            advisory=advisory, kind=EventKind.CREATED if outcome == "new" else EventKind.UPDATED,
            document=entry.name[:1000], message=f"{advisory} from the index: affected ranges unknown",
        )
        review = len({n.key[:300] for n in entry.products}) if existing is None else _open_review(advisory)
    return outcome, advisory.id, review, ""
