"""The management commands as an operator runs them (a real subprocess for the main one)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.core.management import CommandError, call_command

from advisories.models import Advisory, KevEntry
from inventory.models import Cluster
from tests.advisories.conftest import FIXTURES, add_node
from tests.helpers import clean_env, manage

pytestmark = pytest.mark.django_db


def test_ingest_advisories_prints_a_summary_and_is_idempotent():
    out = io.StringIO()
    call_command("ingest_advisories", str(FIXTURES), "--no-progress", stdout=out)
    text = out.getvalue()
    assert "new 6, updated 0, unchanged 0, needs review 11, errors 0; integrity: match 5, mismatch 1" in text
    assert "1 document(s) do not match their published SHA-256" in text
    # Each document's outcome is named; 5703 has NVIDIA's typo and skipped branches to review.
    assert f"{FIXTURES / '5703.json'}: new (4 to review)" in text
    assert f"{FIXTURES / '5582.json'}: new\n" in text
    out = io.StringIO()
    call_command("ingest_advisories", str(FIXTURES), "--no-progress", stdout=out)
    assert "new 0, updated 0, unchanged 6" in out.getvalue()


def test_ingest_advisories_fails_loudly_on_a_bad_document_but_keeps_the_good(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "5582.json").write_bytes((FIXTURES / "5582.json").read_bytes())
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 document"):
        call_command("ingest_advisories", str(tmp_path), "--no-progress", stdout=io.StringIO(), stderr=err)
    assert f"rejected: {tmp_path / 'bad.json'}: invalid JSON" in err.getvalue()
    assert Advisory.objects.filter(publisher_id="5582").exists()


def test_ingest_advisories_runs_as_a_process_with_a_progress_bar(tmp_path):
    env = clean_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", GPUSWEEP_VAR_DIR=str(tmp_path))
    assert manage("migrate", "-v0", env=env).returncode == 0
    result = manage("ingest_advisories", str(FIXTURES), env=env)
    assert result.returncode == 0, result.stderr
    assert "new 6, updated 0, unchanged 0" in result.stdout
    assert "doc" in result.stderr  # tqdm's bar


def test_exposures_lists_as_table_csv_and_json():
    call_command("ingest_advisories", str(FIXTURES / "5703.json"), "--no-progress", stdout=io.StringIO())
    cluster = Cluster.objects.create(name="gpu-a", kind="kubernetes")
    add_node(cluster, "n1", driver="570.172.08")
    add_node(cluster, "n2", driver="570.195.03")
    out = io.StringIO()
    call_command("exposures", "--recompute", "--format", "csv", stdout=out, stderr=io.StringIO())
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [(r["node"], r["advisory"], r["detected_version"], r["fixed_version"], r["state"]) for r in rows] == [
        ("n1", "NVIDIA 5703", "570.172.08", "570.195.03", "open")]
    assert rows[0]["deadline"].startswith("2025-11-08")
    assert len(rows[0]["cves"].split()) == 6
    out = io.StringIO()
    call_command("exposures", "--advisory", "5703", "--format", "json", stdout=out)
    assert json.loads(out.getvalue())[0]["node"] == "n1"
    out = io.StringIO()
    call_command("exposures", stdout=out)
    assert "n1" in out.getvalue() and "1 exposure(s)" in out.getvalue()
    with pytest.raises(CommandError, match="no advisory '9999'"):
        call_command("exposures", "--advisory", "9999", stdout=io.StringIO())


def test_import_kev_reads_a_catalogue_file(tmp_path):
    path = tmp_path / "kev.json"
    path.write_text(json.dumps({"vulnerabilities": [
        {"cveID": "CVE-2024-0132", "dateAdded": "2024-10-01", "dueDate": "2024-10-22", "vulnerabilityName": "x"}]}))
    out = io.StringIO()
    call_command("import_kev", str(path), stdout=out)
    assert "imported 1 KEV entries" in out.getvalue()
    assert str(KevEntry.objects.get().due_date) == "2024-10-22"
    path.write_text('{"vulnerabilities": [{"cveID": "CVE-1"}]}')
    with pytest.raises(CommandError, match=r"vulnerabilities\[0\]: date missing"):
        call_command("import_kev", str(path), stdout=io.StringIO())
    assert KevEntry.objects.count() == 1  # unchanged by the bad catalogue
