"""Sources against a real local HTTP server: documents, feeds, the GitHub layout, the index,
conditional requests, and hostile answers (HTML, 100 MB, a hang)."""

from __future__ import annotations

import time

import pytest

from advisories.http import HttpClient
from advisories.ingest import ingest_documents
from advisories.models import Advisory, SourceState
from advisories.sources import FeedSource, GitHubSource, IndexSource, UrlSource, resolve
from tests.advisories.conftest import FIXTURES, INDEX, hang, huge_body

pytestmark = pytest.mark.django_db


def serve_fixture(handler, path: str, name: str, content_type: str = "application/json") -> None:
    handler.routes[path] = (200, content_type, (FIXTURES / name).read_bytes())


def atom(entries: list[tuple[str, str]]) -> bytes:
    items = "".join(
        f"<entry><id>urn:{i}</id><title>{title}</title><updated>2025-10-09T00:00:00Z</updated>"
        f'<link rel="alternate" href="{href}"/></entry>'
        for i, (title, href) in enumerate(entries)
    )
    return (f'<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">'
            f"<id>urn:feed</id><title>CSAF</title><updated>2025-10-09T00:00:00Z</updated>{items}</feed>").encode()


def test_it_fetches_a_document_url_with_its_sha256_and_then_asks_conditionally(http_server):
    base, handler = http_server
    serve_fixture(handler, "/2025/5703/5703.json", "5703.json")
    serve_fixture(handler, "/2025/5703/5703.json.sha256", "5703.json.sha256", "text/plain")
    url = f"{base}/2025/5703/5703.json"
    summary = ingest_documents(resolve(url).items())
    assert (summary.new, summary.integrity) == (1, {"mismatch": 1})
    advisory = Advisory.objects.get(publisher_id="5703")
    assert (advisory.source, advisory.source_kind) == (url, "url")
    etag = SourceState.objects.get(url=url).etag
    assert etag
    again = ingest_documents(UrlSource(url).items())
    assert (again.new, again.updated, again.unchanged) == (0, 0, 1)
    # The second request carried the ETag and was answered 304: no body, no sha256 fetch.
    assert handler.hits[-1] == ("/2025/5703/5703.json", etag)
    assert [path for path, _ in handler.hits].count("/2025/5703/5703.json.sha256") == 1


def test_a_document_without_a_published_sha256_is_absent_not_match(http_server):
    base, handler = http_server
    serve_fixture(handler, "/5582.json", "5582.json")
    summary = ingest_documents(resolve(f"{base}/5582.json").items())
    assert summary.integrity == {"absent": 1}
    assert Advisory.objects.get(publisher_id="5582").integrity == "absent"


def test_it_reads_an_atom_feed_of_documents(http_server):
    base, handler = http_server
    for bulletin in ("5582", "5703"):
        serve_fixture(handler, f"/csaf/{bulletin}.json", f"{bulletin}.json")
        serve_fixture(handler, f"/csaf/{bulletin}.json.sha256", f"{bulletin}.json.sha256", "text/plain")
    handler.routes["/feed.atom"] = (200, "application/atom+xml", atom([
        ("5582", f"{base}/csaf/5582.json"), ("5703", f"{base}/csaf/5703.json"), ("notes", f"{base}/notes.html")]))
    summary = ingest_documents(resolve(f"{base}/feed.atom").items())
    assert (summary.new, summary.errors, summary.integrity) == (2, [], {"match": 1, "mismatch": 1})
    assert set(Advisory.objects.values_list("source_kind", flat=True)) == {"feed"}
    again = ingest_documents(FeedSource(f"{base}/feed.atom").items())
    assert (again.new, again.updated, again.unchanged) == (0, 0, 1)  # the feed itself answered 304


def test_it_follows_nvidias_github_layout_from_the_commit_feed(http_server):
    base, handler = http_server
    serve_fixture(handler, "/raw/2025/5703/5703.json", "5703.json")
    serve_fixture(handler, "/raw/2025/5703/5703.json.sha256", "5703.json.sha256", "text/plain")
    serve_fixture(handler, "/raw/2024/5582/5582.json", "5582.json")
    handler.routes["/commits/main.atom"] = (200, "application/atom+xml", atom([
        ("Add 2025/5703/5703.json and 2025/5703/5703.md", f"{base}/commit/abc"),
        ("Publish 2024/5582/5582.json", f"{base}/commit/def"),
        ("Update README", f"{base}/commit/123"),
        ("Add bulletin 5670", f"{base}/commit/456"),  # no path: guessed as 2025/5670/5670.json
        ("Add bulletin 5999", f"{base}/commit/789"),  # guessed, not there: skipped quietly
    ]))
    serve_fixture(handler, "/raw/2025/5670/5670.json", "5670.json")
    source = resolve(f"github:{base}/raw|{base}/commits/main.atom")
    assert isinstance(source, GitHubSource)
    summary = ingest_documents(source.items())
    assert (summary.new, summary.integrity, summary.errors) == (3, {"mismatch": 1, "absent": 2}, [])
    assert Advisory.objects.get(publisher_id="5670").source == f"{base}/raw/2025/5670/5670.json"
    assert Advisory.objects.get(publisher_id="5582").source == f"{base}/raw/2024/5582/5582.json"


def test_the_json_index_flags_bulletins_without_csaf_as_ranges_unknown(http_server):
    ingest_documents(resolve(str(FIXTURES / "5703.json")).items())
    summary = ingest_documents(IndexSource(str(INDEX)).items())
    assert (summary.new, summary.unchanged) == (2, 1)  # 5703 has its CSAF already
    assert summary.errors == [f"{INDEX} row 4: date 'Nov 12th' is not like '09 Oct 2025'"]
    toolkit = Advisory.objects.get(publisher_id="5720")
    assert toolkit.ranges_unknown and toolkit.severity == "critical"
    assert toolkit.title == "Security Bulletin: NVIDIA Container Toolkit - November 2025"
    assert toolkit.initial_release_date.date().isoformat() == "2025-11-12"
    assert sorted(toolkit.cves.values_list("cve_id", flat=True)) == ["CVE-2025-99001", "CVE-2025-99002"]
    assert not Advisory.objects.get(publisher_id="5703").ranges_unknown
    # Served over HTTP the same index ingests the same way, and a second time changes nothing.
    base, handler = http_server
    handler.routes["/product-security.json"] = (200, "application/json", INDEX.read_bytes())
    again = ingest_documents(resolve(f"index:{base}/product-security.json").items())
    assert (again.new, again.updated, again.unchanged) == (0, 0, 3)


def test_a_csaf_document_replaces_the_index_placeholder(tmp_path):
    ingest_documents(IndexSource(str(INDEX)).items())
    Advisory.objects.filter(publisher_id="5703").delete()
    ingest_documents(IndexSource(str(INDEX)).items())
    assert Advisory.objects.get(publisher_id="5703").ranges_unknown
    summary = ingest_documents(resolve(str(FIXTURES / "5703.json")).items())
    assert summary.updated == 1
    advisory = Advisory.objects.get(publisher_id="5703")
    assert not advisory.ranges_unknown and advisory.ranges.count() > 0


def test_an_html_page_instead_of_a_feed_is_refused_by_name(http_server):
    base, handler = http_server
    handler.routes["/feed"] = (200, "text/html; charset=utf-8", b"<!DOCTYPE html><html><body>Login</body></html>")
    summary = ingest_documents(resolve(f"{base}/feed").items())
    assert summary.errors == [f"{base}/feed: the feed is an HTML page, not Atom/RSS"]
    assert Advisory.objects.count() == 0


def test_a_100_mb_response_stops_at_the_size_limit(http_server):
    base, handler = http_server
    handler.routes["/huge.json"] = (200, "application/json", huge_body)
    started = time.monotonic()
    summary = ingest_documents(UrlSource(f"{base}/huge.json").items())  # the default limit, 20 MiB
    assert summary.errors == [f"{base}/huge.json: response exceeds the 20971520 byte limit"]
    assert time.monotonic() - started < 10
    assert Advisory.objects.count() == 0


def test_a_hanging_server_times_out_by_name(http_server):
    base, handler = http_server
    handler.routes["/slow.json"] = (200, "application/json", hang)
    started = time.monotonic()
    summary = ingest_documents(UrlSource(f"{base}/slow.json", HttpClient(timeout=1)).items())
    assert len(summary.errors) == 1 and summary.errors[0].startswith(f"{base}/slow.json: ")
    assert "1 s" in summary.errors[0] or "timed out" in summary.errors[0]
    assert time.monotonic() - started < 4


def test_a_server_error_is_reported_by_name(http_server):
    base, _ = http_server
    summary = ingest_documents(resolve(f"{base}/missing.json").items())
    assert summary.errors == [f"{base}/missing.json: HTTP 404 Not Found"]


def test_the_client_sends_its_user_agent(http_server):
    base, handler = http_server
    seen = []

    def record(h):
        seen.append(h.headers.get("User-Agent"))
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(b"{}")

    handler.routes["/ua"] = (200, "application/json", record)
    response = HttpClient().get(f"{base}/ua")
    assert response is not None and response.body == b"{}"
    assert seen[0].startswith("gpusweep-advisories/")
