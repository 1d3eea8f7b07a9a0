"""Every product row of every bulletin ends in a range, a presumed exposure or a review item:
the coverage line, per bulletin, in the API, the console, the report and `manage.py
advisory_coverage`."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from advisories import coverage
from advisories.csaf import DocumentError, parse
from advisories.ingest import ingest_documents
from advisories.models import Advisory
from advisories.sources import FolderSource
from conftest import need
from tests.advisories.conftest import FIXTURES, bulletins
from tests.helpers import REPO, clean_env, manage

TEST_CSAF = FIXTURES.parent / "test-csaf"
NODES = r"(?: \(\d+ nodes?\))?"
LINE = re.compile(rf"^\d+ rows?: \d+ decoded{NODES}, \d+ presumed{NODES}, "
                  r"\d+ under review(?: \(\d+ nodes?(?:: \d+ exposed, \d+ presumed exposed)?\))?$")


def _problems(paths: list[Path]) -> list[str]:
    """What is wrong with each bulletin: it does not parse, or a row ends in nothing."""
    problems = []
    for path in paths:
        try:
            parsed = parse(path.read_bytes(), str(path))
        except DocumentError as exc:
            problems.append(f"does not parse: {exc}")
            continue
        result = coverage.of_parsed(parsed)
        if result.silent:
            problems.append(f"{path}: rows that end in nothing: {result.silent}")
        # Every product row is counted, and every gap the bulletin leaves (a row of its own).
        if (not set(parsed.rows) <= set(result.classes) or sum(result.rows.values()) != len(result.classes)
                or not LINE.match(result.line())):
            problems.append(f"{path}: rows miscounted: {result.line()} of {len(parsed.rows)}")
    return problems


def test_no_row_of_any_bulletin_in_the_repositorys_fixtures_is_silent():
    # Every fixtures folder of the repository, searched by content: a bulletin kept beside OSV
    # records or under another name counts as much as one in a folder of bulletins.
    folders = [f for f in sorted((REPO / "tests").rglob("fixtures")) if f.is_dir()]
    paths = sorted({path for folder in folders for path in bulletins(folder)})
    assert set(FIXTURES.glob("*.json")) | set(TEST_CSAF.glob("*.json")) <= set(paths)
    assert _problems(paths) == []


def test_no_row_of_nvidias_corpus_is_silent(shared_csaf):
    paths = bulletins(shared_csaf)
    assert len(paths) >= 20
    assert _problems(paths) == []


def test_a_bulletin_that_does_not_parse_fails_the_check_and_other_json_is_left_out(tmp_path):
    # The rule the two tests above rely on: found by content, a broken bulletin is a failure.
    (tmp_path / "osv").mkdir()
    good = tmp_path / "osv" / "renamed.json"  # a bulletin in a folder of something else
    shutil.copy(TEST_CSAF / "9002.json", good)
    (tmp_path / "truncated.json").write_bytes((TEST_CSAF / "9001.json").read_bytes()[:2000])
    (tmp_path / "newer.json").write_text('{"document": {"csaf_version": "2.1"}}')
    (tmp_path / "cve.json").write_text('{"cveMetadata": {"cveId": "CVE-2099-1"}, "containers": {}}')
    (tmp_path / "index.json").write_text('{"data": []}')
    paths = bulletins(tmp_path)
    assert [p.name for p in paths] == ["newer.json", "renamed.json", "truncated.json"]
    problems = _problems(paths)
    assert len(problems) == 2 and all(p.startswith("does not parse: ") for p in problems)
    assert "csaf_version '2.1' is not supported" in problems[0] and "invalid JSON" in problems[1]
    assert _problems([good]) == []


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


def test_the_command_prints_the_coverage_of_a_folder():
    out = io.StringIO()
    call_command("advisory_coverage", str(TEST_CSAF), str(FIXTURES / "5703.json"), stdout=out)
    lines = out.getvalue().splitlines()
    expected = len(bulletins(TEST_CSAF)) + 1
    assert len([line for line in lines if line.startswith("NVIDIA ")]) == expected
    assert lines[-1].startswith(f"total ({expected} bulletins): ")
    assert "SILENT" not in out.getvalue()
    parsed = parse((TEST_CSAF / "9002.json").read_bytes(), "9002.json")
    assert f"NVIDIA 9002 (9002.json): {coverage.of_parsed(parsed).line()}" in lines


def test_the_command_reads_any_folder_and_fails_on_a_broken_file(tmp_path):
    # NVIDIA's YEAR/ID/ID.json layout, a per-CVE record beside the bulletins (named, skipped).
    (tmp_path / "2099" / "9005").mkdir(parents=True)
    shutil.copy(TEST_CSAF / "9005.json", tmp_path / "2099" / "9005" / "9005.json")
    (tmp_path / "CVE-2099-1.json").write_text('{"cveMetadata": {"cveId": "CVE-2099-1"}, "containers": {}}')
    out = io.StringIO()
    call_command("advisory_coverage", str(tmp_path), stdout=out)
    parsed = parse((TEST_CSAF / "9005.json").read_bytes(), "9005.json")
    assert f"NVIDIA 9005 (9005.json): {coverage.of_parsed(parsed).line()}" in out.getvalue()
    assert "CVE-2099-1.json: skipped, not a CSAF document" in out.getvalue()
    # A bulletin cut short: its line names it, and the command ends non-zero saying why.
    (tmp_path / "9001.json").write_bytes((TEST_CSAF / "9001.json").read_bytes()[:2000])
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"1 file\(s\) do not parse as CSAF 2\.0: .*9001\.json \(invalid JSON"):
        call_command("advisory_coverage", str(tmp_path), stdout=out)
    assert "9001.json: BROKEN, does not parse as CSAF 2.0 (invalid JSON at line" in out.getvalue()
    assert "total (1 bulletin): " in out.getvalue()  # the others are still counted
    # As a user runs it: exit status 1, the reason on stderr.
    result = manage("advisory_coverage", str(tmp_path), env=clean_env())
    assert result.returncode == 1 and "do not parse as CSAF 2.0" in result.stderr and "9001.json" in result.stderr
    # A folder with no bulletin at all is not a clean result either.
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "junk.json").write_text("{}")
    with pytest.raises(CommandError, match="no CSAF document in"):
        call_command("advisory_coverage", str(tmp_path / "only"), stdout=io.StringIO())


def _stored_9002() -> Advisory:
    """9002 ingested beside three Triton nodes (24.11 open, 24.10 presumed, 24.12 fixed) and a NIM
    node below its fix (1.10.0, open)."""
    from advisories.exposure import recompute
    from inventory.models import Cluster
    from tests.advisories.conftest import add_node

    call_command("ingest_advisories", str(TEST_CSAF / "9002.json"), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="inference", kind="static")
    add_node(cluster, "t-24.11", triton="24.11")
    add_node(cluster, "t-24.10", triton="24.10")
    add_node(cluster, "t-24.12", triton="24.12")
    add_node(cluster, "nim-1.10.0", nim="1.10.0")
    recompute()
    return Advisory.objects.get(publisher_id="9002")


# 9002's six rows: Triton 24.11 (affected; its notes say nothing of earlier releases, so the releases
# before it are presumed and the row is under review) and 24.12 (fixed), NIM and TensorRT-LLM each an
# affected and a fixed row. The nodes under review are every Triton node, one exposed (24.11) and
# one presumed exposed (24.10), counted there and never as a presumed row's.
LINE_9002 = ("6 rows: 5 decoded (1 node), 0 presumed (0 nodes), "
             "1 under review (3 nodes: 1 exposed, 1 presumed exposed)")


@pytest.mark.django_db
def test_a_stored_advisory_counts_rows_and_the_nodes_each_class_touches(client):
    from django.contrib.auth.models import Group, User

    advisory = _stored_9002()
    result = coverage.of_advisory(advisory)
    assert result.line() == LINE_9002
    assert result.nodes == {"decoded": 1, "presumed": 0, "review": 3}
    assert result.review_nodes == {"exposed": 1, "presumed": 1}
    user = User.objects.create_user("vera")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    detail = client.get(f"/api/v1/advisories/advisories/{advisory.public_id}/").json()
    assert detail["coverage"]["line"] == result.line()
    listed = client.get("/api/v1/advisories/advisories/").json()["results"]
    assert [a["coverage"]["line"] for a in listed] == [result.line()]
    for url in (f"/advisories/{advisory.public_id}/", "/advisories/"):
        assert result.line() in client.get(url).content.decode(), url


@pytest.mark.django_db
def test_the_advisory_report_carries_the_coverage_line(make_user, tmp_path):
    advisory = _stored_9002()
    result = coverage.of_advisory(advisory)
    assert result.line() == LINE_9002
    client = Client()
    client.force_login(make_user("vera", "viewer"))
    base = f"/advisories/{advisory.public_id}/report"
    # JSON: rows and nodes per class, and the line, as the API and the console give them.
    data = json.loads(client.get(f"{base}.json").content)
    assert data["coverage"] == result.as_dict()
    assert data["coverage"]["nodes"] == {"decoded": 1, "presumed": 0, "review": 3}
    csv_text = client.get(f"{base}.csv").content.decode()
    assert "# Coverage" in csv_text and result.line() in csv_text
    need(bool(shutil.which("pdftotext")), "needs poppler-utils: scripts/install-system-deps.sh")
    response = client.get(f"{base}.pdf")
    assert response.status_code == 200 and response.content[:5] == b"%PDF-"
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(response.content)
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True, text=True,
                          timeout=60).stdout
    assert "Coverage" in text and " ".join(result.line().split()) in " ".join(text.split())


def _printed(out: str) -> dict[str, str]:
    """The command's line per bulletin id."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^NVIDIA (\S+) \([^)]*\): (.*)$", out, re.M)}


def _command_equals_stored(root: Path) -> None:
    out = io.StringIO()
    call_command("advisory_coverage", str(root), stdout=out)
    printed = _printed(out.getvalue())
    paths = bulletins(root)
    assert set(printed) == {parse(p.read_bytes(), p.name).publisher_id for p in paths}
    summary = ingest_documents(FolderSource(str(root)).items())
    assert [e for e in summary.errors if any(e.startswith(f"{p}: ") for p in paths)] == []
    for advisory in Advisory.objects.filter(publisher="NVIDIA", publisher_id__in=printed):
        stored = coverage.of_advisory(advisory)
        # The same line, less the node counts (only the product matches the inventory).
        assert stored.line(nodes=False) == printed[advisory.publisher_id], advisory.publisher_id
        assert stored.nodes is not None and "nodes" in stored.line()
    assert Advisory.objects.filter(publisher="NVIDIA", publisher_id__in=printed).count() == len(printed)


@pytest.mark.django_db
def test_the_command_prints_the_coverage_the_product_stores_for_every_fixture_bulletin():
    # Every row, fixed rows too, counted by one definition (coverage.classify): the command's line
    # of a document is the product's line of it once ingested (9002: 6 rows, not the 3 affected).
    _command_equals_stored(FIXTURES.parent)
    assert coverage.of_advisory(Advisory.objects.get(publisher_id="9002")).line().startswith("6 rows: ")


@pytest.mark.django_db
def test_the_command_prints_the_coverage_the_product_stores_for_nvidias_corpus(shared_csaf):
    _command_equals_stored(shared_csaf)


@pytest.mark.django_db
def test_an_advisory_stored_before_its_rows_were_kept_counts_them_after_the_next_ingest():
    call_command("ingest_advisories", str(TEST_CSAF / "9002.json"), "--no-progress", stdout=io.StringIO())
    Advisory.objects.filter(publisher_id="9002").update(product_rows={}, read_rows=[])
    advisory = Advisory.objects.get(publisher_id="9002")
    # Its ranges and review items still say something of every row they name: nothing silent.
    assert coverage.of_advisory(advisory).line(nodes=False) == "3 rows: 2 decoded, 0 presumed, 1 under review"
    call_command("ingest_advisories", str(TEST_CSAF / "9002.json"), "--no-progress", stdout=io.StringIO())
    assert coverage.of_advisory(advisory).line(nodes=False) == "6 rows: 5 decoded, 0 presumed, 1 under review"


@pytest.mark.django_db
def test_the_nodes_of_a_class_are_those_its_rows_touch():
    """No class touches nodes without rows; a node presumed exposed through a row under review is
    counted under review (and said to be presumed exposed there), never as a presumed row's."""
    from advisories.exposure import recompute
    from advisories.models import Exposure
    from inventory.models import Cluster
    from tests.advisories.conftest import add_node

    ingest_documents(FolderSource(str(FIXTURES.parent)).items())
    cluster = Cluster.objects.create(name="fleet", kind="static")
    fleet = {"driver": ["470.82.01", "535.104.05", "550.54.15", "570.124.06", "570.172.08", "580.82.07",
                        "580.95.05"],
             "triton": ["24.10", "24.11", "24.12"], "container_toolkit": ["1.16.1", "1.17.8"],
             "nim": ["1.10.0"], "tensorrt_llm": ["0.18.0"], "gpu_operator": ["24.6.1"], "dcgm": ["3.3.5"]}
    for component, versions in fleet.items():
        for version in versions:
            add_node(cluster, f"{component}-{version}", **{component: version})
    recompute()
    advisories = list(Advisory.objects.filter(ranges_unknown=False))
    found = coverage.of_advisories([a.pk for a in advisories])
    presumed_via_review = 0
    for advisory in advisories:
        result = found[advisory.pk]
        assert result.nodes is not None and result.review_nodes is not None
        for name in coverage.CLASSES:
            assert result.rows[name] or not result.nodes[name], (advisory.publisher_id, result.line())
        assert max(result.review_nodes.values()) <= result.nodes["review"], result.line()
        exposed = Exposure.objects.filter(advisory=advisory).values("node").distinct().count()
        assert exposed <= sum(result.nodes.values()), (advisory.publisher_id, result.line())
        presumed = Exposure.objects.filter(advisory=advisory, affected_range__basis__in=["undecoded",
                                           "unsupported_branch"]).values("node").distinct().count()
        assert presumed <= result.nodes["presumed"] + result.review_nodes["presumed"], result.line()
        presumed_via_review += result.review_nodes["presumed"]
    assert presumed_via_review  # the fleet does reach a node presumed through a row under review


@pytest.mark.django_db
def test_a_folder_is_read_by_one_rule_an_osv_record_or_other_json_beside_bulletins_is_no_error(tmp_path):
    # A CSAF folder holding, beside a bulletin, an OSV record (the ingest reads it as a distribution
    # advisory, as it reads any OSV folder), an OSV-looking record without schema_version, a CVE
    # record, a list and an object of no kind: nothing is an error; what is skipped is named, the
    # same by the ingest and by the coverage command.
    shutil.copy(TEST_CSAF / "9002.json", tmp_path / "9002.json")
    shutil.copy(FIXTURES.parent / "osv" / "USN-5547-1.json", tmp_path / "USN-5547-1.json")
    (tmp_path / "GHSA-0000.json").write_text('{"id": "GHSA-0000", "modified": "2025-01-01T00:00:00Z", "affected": []}')
    (tmp_path / "CVE-2099-1.json").write_text('{"cveMetadata": {"cveId": "CVE-2099-1"}, "containers": {}}')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text('{"name": "not a bulletin"}')
    summary = ingest_documents(FolderSource(str(tmp_path)).items())
    assert summary.errors == [] and summary.new == 2
    outcomes = {Path(document).name: found[0] for document, found in summary.outcomes.items()}
    assert outcomes["9002.json"].startswith("new") and outcomes["USN-5547-1.json"].startswith("new")
    skipped = {name: outcome.removeprefix("skipped: ") for name, outcome in outcomes.items()
               if outcome.startswith("skipped: ")}
    assert set(skipped) == {"GHSA-0000.json", "CVE-2099-1.json", "list.json", "other.json"}
    out = io.StringIO()
    call_command("advisory_coverage", str(tmp_path), stdout=out)
    lines = out.getvalue().splitlines()
    assert "BROKEN" not in out.getvalue() and lines[-1].startswith("total (1 bulletin): ")
    for name, why in skipped.items():
        assert f"{name}: skipped, not a CSAF document: {why}" in lines
    assert any(line.startswith("USN-5547-1.json: skipped, not a CSAF document: an OSV record") for line in lines)
