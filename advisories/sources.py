"""Where advisories come from, behind one interface: `Source.items()` yields fetched documents,
index rows, "not modified" markers and per-document errors; `advisories.ingest` consumes them.

Kinds: a CSAF file, a folder (also a mirror of NVIDIA's GitHub layout YEAR/ID/ID.json, with its
CVE_index.csv), a document URL, a ROLIE/Atom/RSS feed of documents (feedparser), NVIDIA's GitHub
repository (its Atom commit feed names the YEAR/ID/ID.json paths that changed), NVIDIA's JSON
index of bulletins and its CVE index CSV. A file a source does not ingest is named with why
(`Skipped`), and one it cannot read is an error of its own: the others are still read. Every
remote fetch goes through advisories.http.HttpClient and is conditional on the validators stored
per URL (SourceState), so unchanged documents cost a 304.
"""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import feedparser
from django.conf import settings

from advisories import bounds, components, osv
from advisories.choices import ReviewKind, Severity, SourceKind
from advisories.csaf import DocumentError, ReviewNote
from advisories.http import HttpClient
from advisories.ingest import FetchedDocument, IndexEntry, NotModified, Skipped
from advisories.models import SourceState

Item = FetchedDocument | IndexEntry | DocumentError | NotModified | Skipped


class Source:
    kind: str = ""

    def __init__(self, location: str, client: HttpClient | None = None) -> None:
        self.location = location
        self.client = client or HttpClient()

    def items(self) -> Iterator[Item]:
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{self.kind}:{self.location}"


def _published_sha(text: str) -> str:
    # "<hex>  5703.json" or just "<hex>"; kept as written so a malformed file shows as a mismatch.
    return text.strip().split()[0].lower() if text.strip() else ""


# What a JSON file is, read from its content (never its name or folder): one rule for reading a
# folder, by the ingest (FolderSource) and by `manage.py advisory_coverage` alike.
CSAF, OSV, INDEX, CVE_RECORD, OTHER = "csaf", "osv", "index", "cve_record", "other"
KIND_NAMES = {CSAF: "a CSAF document", OSV: "an OSV record or Livepatch notice", INDEX: "NVIDIA's index of bulletins",
              CVE_RECORD: "a per-CVE record (CVE JSON 5)", OTHER: "JSON of no kind gpusweep reads"}
# The kinds a folder's reader names and skips, with why; the others are read (the ingest reads
# OSV records and indexes too; the coverage command reads CSAF documents only).
SKIPPED = {CVE_RECORD: "a per-CVE record (CVE JSON 5): its bulletin's CSAF document carries it",
           OTHER: "not a kind of JSON gpusweep reads (a CSAF document, an OSV record naming its schema_version, "
                  "a Livepatch notice, NVIDIA's index of bulletins)"}


def json_kind(content: bytes) -> str:
    """The kind of a JSON file. A file that is not JSON at all, or an object with a `document` (a
    CSAF document's top level), is a CSAF document: one that does not parse is a broken bulletin,
    to be reported, never to drop out. A CVE record, an OSV record or Livepatch notice
    (advisories.osv), NVIDIA's index (rows under `data`); anything else (a list, another object)
    is OTHER. One too big or too deep to read is a CSAF document too: the ingest refuses it
    (advisories.bounds) and says why."""
    if len(content) > bounds.MAX_BYTES:
        return CSAF
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deep
        return CSAF
    if not isinstance(data, dict):
        return OTHER
    if "document" in data:
        return CSAF
    if "cveMetadata" in data:
        return CVE_RECORD
    if osv.is_osv(data) or osv.is_lsn(data):
        return OSV
    if isinstance(data.get("data"), list):
        return INDEX
    return OTHER


def _index_rows(content: bytes, name: str) -> Iterator[IndexEntry | DocumentError]:
    try:
        data = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        yield DocumentError(name, f"invalid JSON index: {exc}")
        return
    rows = data.get("data") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        yield DocumentError(name, "JSON index should hold a list of rows under 'data'")
        return
    for i, row in enumerate(rows):
        try:
            entry = parse_index_row(row, f"{name} row {i + 1}")
        except DocumentError as exc:
            yield exc
            continue
        entry.document = name
        yield entry


def _index_date(value: Any, where: str) -> dt.datetime | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise DocumentError(where, f"date should be text like '09 Oct 2025', got {type(value).__name__}")
    for fmt in ("%d %b %Y", "%d %B %Y", "%Y-%m-%d"):
        try:
            return dt.datetime.strptime(value.strip(), fmt).replace(tzinfo=dt.UTC)
        except ValueError:
            continue
    raise DocumentError(where, f"date {value!r} is not like '09 Oct 2025'")


def parse_index_row(row: Any, where: str) -> IndexEntry:
    if not isinstance(row, dict):
        raise DocumentError(where, "row should be an object")
    keys = {k.lower().strip(): v for k, v in row.items()}
    bulletin = keys.get("bulletin id") or keys.get("bulletin_id") or keys.get("id")
    if not isinstance(bulletin, str | int) or not str(bulletin).strip():
        raise DocumentError(where, "missing 'bulletin id'")
    title = keys.get("title")
    if not isinstance(title, str) or not title.strip():
        raise DocumentError(where, "missing 'title'")
    title = html.unescape(re.sub(r"<[^>]+>", "", title)).strip()  # the index wraps titles in <a href>
    cves_raw = keys.get("cve identifier(s)") or keys.get("cve identifiers") or keys.get("cves") or ""
    if isinstance(cves_raw, list):
        cves_raw = ",".join(str(c) for c in cves_raw)
    if not isinstance(cves_raw, str):
        raise DocumentError(where, "'cve identifier(s)' should be text")
    cve_ids = sorted({c.upper() for c in re.findall(r"CVE-\d{4}-\d{4,}", cves_raw, flags=re.I)})
    severity_raw = keys.get("severity") or ""
    if not isinstance(severity_raw, str):
        raise DocumentError(where, "'severity' should be text")
    severity = Severity.worst([Severity.normalize(s) for s in re.split(r"[,/;]", severity_raw)])
    return IndexEntry(
        name=where, publisher_id=str(bulletin).strip(), title=title, severity=severity, cve_ids=cve_ids,
        published=_index_date(keys.get("publish date"), where), updated=_index_date(keys.get("last updated"), where),
    )


class FileSource(Source):
    kind = SourceKind.FILE

    def items(self, content: bytes | None = None) -> Iterator[Item]:
        path = Path(self.location)
        if content is None:
            try:
                content = path.read_bytes()
            except OSError as exc:
                yield DocumentError(str(path), f"cannot read: {exc.strerror}")
                return
        if path.suffix.lower() == ".csv":
            yield from cve_index_rows(content, str(path))
            return
        if json_kind(content) == INDEX:
            yield from _index_rows(content, str(path))
            return
        sha_path = path.with_name(path.name + ".sha256")
        published = _published_sha(sha_path.read_text()) if sha_path.exists() else None
        yield FetchedDocument(str(path), content, self.kind, published)


class FolderSource(Source):
    """Every *.json below the folder (flat, or NVIDIA's YEAR/ID/ID.json layout), then every CVE
    index CSV (so a bulletin with a CSAF document is read from it first). Other files are named
    as skipped; one that cannot be read is reported alone."""

    kind = SourceKind.FOLDER

    def items(self) -> Iterator[Item]:
        root = Path(self.location)
        if not root.is_dir():
            yield DocumentError(str(root), "not a folder")
            return
        indexes: list[Path] = []
        for path in sorted(root.rglob("*")):
            if path.is_dir():
                continue
            if path.suffix == ".sha256" and path.with_suffix("").suffix == ".json":
                continue  # read with its document
            if path.suffix.lower() == ".csv":
                indexes.append(path)
                continue
            if path.suffix.lower() == ".zip":
                yield from BundleSource(str(path), self.client).items()
                continue
            if path.suffix.lower() != ".json":
                yield Skipped(str(path), "not a CSAF or OSV document (.json), an OSV bundle (.zip) or NVIDIA's "
                              "CVE index (.csv)")
                continue
            try:
                content = path.read_bytes()
            except OSError as exc:
                problem = "broken symbolic link" if path.is_symlink() and not path.exists() else exc.strerror
                yield DocumentError(str(path), f"cannot read: {problem}")
                continue
            kind = json_kind(content)
            if kind in SKIPPED:
                yield Skipped(str(path), SKIPPED[kind])
                continue
            for item in FileSource(str(path), self.client).items(content):
                if isinstance(item, FetchedDocument):
                    item.source_kind = self.kind
                yield item
        for path in indexes:
            yield from FileSource(str(path), self.client).items()


CVE_INDEX_COLUMNS = ("CVE", "CVSS", "Severity", "Vector", "CWE", "Bulletin", "Affected Product",
                     "Affected Version", "Fixed In")


def cve_index_rows(content: bytes, name: str) -> Iterator[IndexEntry | DocumentError | Skipped]:
    """NVIDIA's CVE index (CVE_index_YEAR.csv, semicolon separated): one entry per bulletin.

    It names each CVE's bulletin, score and the affected product and versions as text. A bulletin
    with a CSAF document keeps that (ingest prefers it); one without becomes "affected ranges
    unknown", each affected product a review item, mapped to the component it names if any.
    """
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        yield DocumentError(name, f"not UTF-8 text (byte {exc.start})")
        return
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=";")
    header = tuple(cell.strip() for cell in next(reader, []))
    if header[:len(CVE_INDEX_COLUMNS)] != CVE_INDEX_COLUMNS:
        yield Skipped(name, f"a CSV file that is not NVIDIA's CVE index (columns {';'.join(header)[:120]})")
        return
    bulletins: dict[str, dict[str, Any]] = {}
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        where = f"{name} line {reader.line_num}"
        if len(row) < len(CVE_INDEX_COLUMNS):
            yield DocumentError(where, f"{len(row)} values for {len(CVE_INDEX_COLUMNS)} columns")
            continue
        cve, _score, severity, _vector, _cwe, bulletin, product, affected, fixed = (c.strip() for c in row[:9])
        if not re.fullmatch(r"CVE-\d{4}-\d{4,}", cve, flags=re.I) or not bulletin.isdigit():
            yield DocumentError(where, f"not a CVE and bulletin id: {cve!r}, {bulletin!r}")
            continue
        entry = bulletins.setdefault(bulletin, {"cves": set(), "severities": [], "products": {}})
        entry["cves"].add(cve.upper())
        entry["severities"].append(Severity.normalize(severity))
        component = components.classify(product)
        key = f"index:{components.slug(product)}:{components.slug(affected)}"[:300]
        entry["products"].setdefault(key, ReviewNote(
            key, ReviewKind.INDEX_ONLY, f"{product}: {affected} (fixed in {fixed})"[:500],
            "known only from NVIDIA's CVE index: no CSAF document to decode; "
            + (f"maps to component {component.name}" if component else "no inventory component maps to it"),
            component.name if component else ""))
    for bulletin, entry in bulletins.items():
        products = sorted({n.raw.split(":")[0] for n in entry["products"].values()})
        yield IndexEntry(
            name=f"{name} bulletin {bulletin}", publisher_id=bulletin,
            title=f"NVIDIA security bulletin {bulletin}: {', '.join(products)}"[:500],
            severity=Severity.worst(entry["severities"]), cve_ids=sorted(entry["cves"]), published=None,
            updated=None, document=name, products=list(entry["products"].values()))


class UrlSource(Source):
    kind = SourceKind.URL

    def items(self) -> Iterator[Item]:
        try:
            yield from self._fetch(self.location)
        except DocumentError as exc:
            yield exc

    # A URL that was guessed (see GitHubSource): a 404 there is no error.
    missing_ok = False

    def _fetch(self, url: str) -> Iterator[Item]:
        state = SourceState.objects.filter(url=url).first()
        response = self.client.get(url, etag=state.etag if state else "",
                                   last_modified=state.last_modified if state else "", missing_ok=self.missing_ok)
        if response is None:
            return
        if response.not_modified:
            yield NotModified(url)
            return
        if json_kind(response.body) == INDEX:
            yield from _index_rows(response.body, url)
            return
        sha = self.client.get(url + ".sha256", missing_ok=True)
        published = _published_sha(sha.body.decode("utf-8", "replace")) if sha is not None else None
        yield FetchedDocument(url, response.body, self.kind, published, response.validators())


def _check_feed(body: bytes, content_type: str, url: str) -> Any:
    head = body[:512].lstrip().lower()
    if "html" in content_type.lower() or head.startswith((b"<!doctype html", b"<html")):
        raise DocumentError(url, "the feed is an HTML page, not Atom/RSS")
    parsed = feedparser.parse(body)
    if parsed.bozo and not parsed.entries:
        raise DocumentError(url, f"not an Atom/RSS feed: {parsed.get('bozo_exception')}")
    if not parsed.get("version") and not parsed.entries:
        raise DocumentError(url, "not an Atom/RSS feed")
    return parsed


class FeedSource(Source):
    """A ROLIE/Atom/RSS feed whose entries link CSAF documents (links ending in .json)."""

    kind = SourceKind.FEED

    def items(self) -> Iterator[Item]:
        try:
            state = SourceState.objects.filter(url=self.location).first()
            response = self.client.get(self.location, etag=state.etag if state else "",
                                       last_modified=state.last_modified if state else "")
            assert response is not None
            if response.not_modified:
                yield NotModified(self.location)
                return
            feed = _check_feed(response.body, response.content_type, self.location)
        except DocumentError as exc:
            yield exc
            return
        for url in self.document_urls(feed):
            for item in self.document_source(url).items():
                if isinstance(item, FetchedDocument):
                    item.source_kind = self.kind
                yield item
        # The feed's own validators are saved last: a failure above re-reads it next time.
        SourceState.objects.update_or_create(
            url=self.location, defaults={"etag": response.etag, "last_modified": response.last_modified}
        )

    def document_source(self, url: str) -> UrlSource:
        return UrlSource(url, self.client)

    def document_urls(self, feed: Any) -> list[str]:
        urls: list[str] = []
        for entry in feed.entries:
            candidates = [link.get("href", "") for link in entry.get("links", [])]
            candidates += [c.get("src", "") for c in entry.get("content", []) if isinstance(c, dict)]
            candidates.append(entry.get("link", ""))
            for href in candidates:
                if href and href.split("?")[0].endswith(".json") and href not in urls:
                    urls.append(href)
        return urls


_GITHUB_PATH = re.compile(r"\b(20\d\d)/(\d{4,6})/\2\.json\b")
_BULLETIN_ID = re.compile(r"(?<![\w./-])(\d{4,5})(?![\w./-])")


class GitHubSource(FeedSource):
    """NVIDIA/product-security: the Atom commit feed names changed YEAR/ID/ID.json paths, fetched
    from the raw base URL with their ID.json.sha256. Location: "<raw base>|<feed url>"."""

    kind = SourceKind.GITHUB

    def __init__(self, location: str, client: HttpClient | None = None) -> None:
        super().__init__(location, client)
        raw_base, _, feed = location.partition("|")
        self.raw_base = raw_base.rstrip("/")
        self.location = feed or f"{self.raw_base}/commits.atom"
        self.guessed: set[str] = set()

    def document_source(self, url: str) -> UrlSource:
        source = UrlSource(url, self.client)
        source.missing_ok = url in self.guessed
        return source

    def document_urls(self, feed: Any) -> list[str]:
        paths: list[str] = []
        self.guessed = set()
        for entry in feed.entries:
            text = " ".join([entry.get("title", ""), entry.get("summary", "")]
                            + [c.get("value", "") for c in entry.get("content", []) if isinstance(c, dict)]
                            + [link.get("href", "") for link in entry.get("links", [])])
            named = _GITHUB_PATH.findall(text)
            for year, bulletin in named:
                path = f"{year}/{bulletin}/{bulletin}.json"
                if path not in paths:
                    paths.append(path)
            # Commit messages often name only the bulletin ("Add 5703"): guess YEAR/ID/ID.json from
            # the commit's year; a guess that is not there is skipped, not an error.
            updated = entry.get("updated_parsed")
            if not named and updated:
                for bulletin in _BULLETIN_ID.findall(entry.get("title", "")):
                    if not 1990 <= int(bulletin) <= 2099:
                        path = f"{updated.tm_year}/{bulletin}/{bulletin}.json"
                        if path not in paths:
                            paths.append(path)
                            self.guessed.add(f"{self.raw_base}/{path}")
        return [f"{self.raw_base}/{p}" for p in paths]


class IndexSource(Source):
    kind = SourceKind.INDEX

    def items(self) -> Iterator[Item]:
        if self.location.startswith(("http://", "https://")):
            yield from UrlSource(self.location, self.client).items()
            return
        try:
            content = Path(self.location).read_bytes()
        except OSError as exc:
            yield DocumentError(self.location, f"cannot read: {exc.strerror}")
            return
        if self.location.lower().endswith(".csv"):
            yield from cve_index_rows(content, self.location)
            return
        yield from _index_rows(content, self.location)


# An osv.dev bundle (all.zip of an ecosystem) holds tens of thousands of small records: a member
# above this is not one, and the whole is read from memory.
BUNDLE_MEMBER_MAX = 16 * 1024 * 1024


class BundleSource(Source):
    """An osv.dev-style bundle: a zip of OSV records (a local path or a URL, fetched conditionally).
    Each member is a document of its own ("bundle.zip!USN-7328-2.json"), rejected alone."""

    kind = SourceKind.BUNDLE

    def items(self) -> Iterator[Item]:
        try:
            body = self._body()
        except DocumentError as exc:
            yield exc
            return
        if body is None:
            yield NotModified(self.location)
            return
        try:
            archive = zipfile.ZipFile(io.BytesIO(body))
        except zipfile.BadZipFile as exc:
            yield DocumentError(self.location, f"not a zip bundle: {exc}")
            return
        with archive:
            for info in sorted(archive.infolist(), key=lambda i: i.filename):
                yield from self._member(archive, info)

    def _body(self) -> bytes | None:
        if not self.location.startswith(("http://", "https://")):
            try:
                return Path(self.location).read_bytes()
            except OSError as exc:
                raise DocumentError(self.location, f"cannot read: {exc.strerror}") from None
        state = SourceState.objects.filter(url=self.location).first()
        response = self.client.get(self.location, etag=state.etag if state else "",
                                   last_modified=state.last_modified if state else "")
        assert response is not None
        if response.not_modified:
            return None
        # Saved before the members are read: each member is a document with its own outcome.
        SourceState.objects.update_or_create(
            url=self.location, defaults={"etag": response.etag, "last_modified": response.last_modified})
        return response.body

    def _member(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[Item]:
        name = f"{self.location}!{info.filename}"
        if info.is_dir():
            return
        if not info.filename.lower().endswith(".json"):
            yield Skipped(name, "not an OSV record (.json)")
            return
        if info.file_size > BUNDLE_MEMBER_MAX:
            yield DocumentError(name, f"{info.file_size} bytes: larger than any OSV record ({BUNDLE_MEMBER_MAX})")
            return
        try:
            content = archive.read(info)
        except (zipfile.BadZipFile, OSError, RuntimeError) as exc:
            yield DocumentError(name, f"cannot read from the bundle: {exc}")
            return
        yield FetchedDocument(name, content, self.kind, None)


PREFIXES: dict[str, type[Source]] = {
    "file": FileSource, "folder": FolderSource, "url": UrlSource, "feed": FeedSource,
    "github": GitHubSource, "index": IndexSource, "bundle": BundleSource,
}


def resolve(spec: str, client: HttpClient | None = None) -> Source:
    """A configured source name, "<kind>:<location>", a path, or a URL."""
    configured: dict[str, str] = settings.GPUSWEEP_ADVISORY_SOURCES
    if spec in configured:
        spec = configured[spec]
    kind, sep, rest = spec.partition(":")
    if sep and kind in PREFIXES and not rest.startswith("//"):
        return PREFIXES[kind](rest, client)
    if spec.split("?")[0].lower().endswith(".zip"):
        return BundleSource(spec, client)
    if spec.startswith(("http://", "https://")):
        return (UrlSource if spec.split("?")[0].endswith(".json") else FeedSource)(spec, client)
    path = Path(spec)
    if path.is_dir():
        return FolderSource(spec, client)
    if path.exists():
        return FileSource(spec, client)
    names = ", ".join(sorted(configured)) or "none"
    raise DocumentError(spec, f"no such file, folder, URL or configured source (configured: {names})")
