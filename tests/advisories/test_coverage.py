"""Every product row of every bulletin ends in a range, a presumed exposure or a review item:
the coverage line, per bulletin, in the API, the console, the report and `manage.py
advisory_coverage`."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command

from advisories import coverage
from advisories.csaf import DocumentError, parse
from tests.advisories.conftest import FIXTURES

TEST_CSAF = FIXTURES.parent / "test-csaf"
LINE = re.compile(r"^\d+ rows?: \d+ decoded(?: \(\d+ nodes?\))?, \d+ presumed(?: \(\d+ nodes?\))?, "
                  r"\d+ under review(?: \(\d+ nodes?\))?$")


def _bulletins(folder: Path) -> list[Path]:
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            parse(path.read_bytes(), path.name)
        except DocumentError:
            continue  # a per-CVE record, not a CSAF document
        out.append(path)
    return out


def _check(folder: Path) -> int:
    paths = _bulletins(folder)
    assert paths, folder
    for path in paths:
        parsed = parse(path.read_bytes(), path.name)
        result = coverage.of_parsed(parsed)
        assert result.silent == [], f"{path.name}: rows that end in nothing: {result.silent}"
        assert sum(result.rows.values()) == len(parsed.rows), path.name
        assert LINE.match(result.line()), result.line()
    return len(paths)


def test_no_row_of_the_bundled_bulletins_is_silent():
    assert _check(FIXTURES) == 6
    assert _check(TEST_CSAF) == 6


def test_no_row_of_nvidias_corpus_is_silent(shared_csaf):
    assert _check(shared_csaf) >= 20


def test_a_row_that_does_not_decode_is_under_review_and_quoted():
    parsed = parse((TEST_CSAF / "9004.json").read_bytes(), "9004.json")
    result = coverage.of_parsed(parsed)
    assert result.rows["review"] >= 2 and result.rows["decoded"] > 0
    note = next(n for n in parsed.review if n.raw.endswith("through the next maintenance release"))
    assert "'570 172 08all versions through the next maintenance release'" in note.reason
    # Its fixed row does not decode either, and no other CVE's fix is borrowed: presumed across
    # its branch, with no fixed version.
    presumed = [r for r in parsed.ranges if r.product_id == note.key]
    assert presumed and {(r.basis, r.lower, r.upper, r.fixed_version) for r in presumed} == {
        ("undecoded", "570", "580", "")}
    # The fixed row alone hits nobody: a review item, no range.
    fixed = next(n for n in parsed.review if n.raw == "see the vgpu release notes")
    assert not [r for r in parsed.ranges if r.product_id == fixed.key]


def test_the_command_prints_the_coverage_of_a_folder(tmp_path):
    out = io.StringIO()
    call_command("advisory_coverage", str(TEST_CSAF), str(FIXTURES / "5703.json"), stdout=out)
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if line.startswith("NVIDIA ")]) == 7
    assert lines[-1].startswith("total (7 bulletins): ")
    assert "SILENT" not in out.getvalue()
    parsed = parse((TEST_CSAF / "9002.json").read_bytes(), "9002.json")
    assert f"NVIDIA 9002 (9002.json): {coverage.of_parsed(parsed).line()}" in lines
    (tmp_path / "junk.json").write_text("{}")
    junk = io.StringIO()
    call_command("advisory_coverage", str(tmp_path), stdout=junk)
    assert "not a CSAF document" in junk.getvalue()


@pytest.mark.django_db
def test_a_stored_advisory_counts_rows_and_the_nodes_each_class_touches(client):
    from django.contrib.auth.models import Group, User

    from advisories.exposure import recompute
    from advisories.models import Advisory
    from inventory.models import Cluster
    from tests.advisories.conftest import add_node

    call_command("ingest_advisories", str(TEST_CSAF / "9002.json"), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="inference", kind="static")
    add_node(cluster, "t-24.11", triton="24.11")
    add_node(cluster, "t-24.10", triton="24.10")
    add_node(cluster, "t-24.12", triton="24.12")
    recompute()
    advisory = Advisory.objects.get(publisher_id="9002")
    result = coverage.of_advisory(advisory)
    assert result.nodes is not None
    # 24.11 is open (decoded); 24.10 presumed (its notes say nothing of earlier releases), and the
    # Triton row is under review for that: the three Triton nodes are touched by the review item.
    assert (result.nodes["decoded"], result.nodes["presumed"], result.nodes["review"]) == (1, 1, 3)
    assert result.rows["review"] >= 1
    user = User.objects.create_user("vera")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    detail = client.get(f"/api/v1/advisories/advisories/{advisory.public_id}/").json()
    assert detail["coverage"]["line"] == result.line()
    listed = client.get("/api/v1/advisories/advisories/").json()["results"]
    assert [a["coverage"]["line"] for a in listed] == [result.line()]
    for url in (f"/advisories/{advisory.public_id}/", "/advisories/"):
        assert result.line() in client.get(url).content.decode(), url
