"""The suite's own rule: under CI=true a skipped test fails the run."""

from __future__ import annotations

import pytest

from tests.helpers import REPO

pytest_plugins = ["pytester"]

SKIPPING_TEST = """
import pytest

def test_needs_something_absent():
    pytest.skip("install the thing")

def test_fine():
    assert True
"""


@pytest.fixture(autouse=True)
def no_third_party_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules under test are conftest.py's own hooks, which need no installed plugin; loading them all
    (hypothesis, schemathesis, playwright, asyncio...) was ~2.8 s of CPU in each of the seven inner runs, 0.3 s
    without."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest((REPO / "conftest.py").read_text())
    pytester.makepyfile(SKIPPING_TEST)
    return pytester


def test_it_fails_the_run_when_a_test_skips_under_ci(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_subprocess("-p", "no:django")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skips are failures under CI*"])


def test_it_lets_a_skip_pass_outside_ci(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest_subprocess("-p", "no:django")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)


def test_only_the_real_cluster_suite_may_skip_under_ci(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    from conftest import REAL_CLUSTER_SKIP

    pytester.makeconftest((REPO / "conftest.py").read_text())
    pytester.makepyfile(f"""
import pytest

def test_real_cluster():
    pytest.skip({REAL_CLUSTER_SKIP + " (none here)"!r})

def test_fine():
    assert True
""")
    monkeypatch.setenv("CI", "true")
    result = pytester.runpytest_subprocess("-p", "no:django")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)


def test_a_test_needing_postgres_is_deselected_without_it_and_runs_with_it_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    pytester.makeconftest((REPO / "conftest.py").read_text())
    pytester.makepyfile("""
import pytest

@pytest.mark.postgres
def test_on_postgres():
    assert True

def test_anywhere():
    assert True
""")
    monkeypatch.setenv("CI", "true")
    monkeypatch.delenv("DATABASE_URL", raising=False)
    sqlite_pass = pytester.runpytest_subprocess("-p", "no:django")
    assert sqlite_pass.ret == pytest.ExitCode.OK
    sqlite_pass.assert_outcomes(passed=1, deselected=1)
    monkeypatch.setenv("DATABASE_URL", "postgres://root@127.0.0.1:5432/none")
    postgres_pass = pytester.runpytest_subprocess("-p", "no:django")
    postgres_pass.assert_outcomes(passed=2)


def test_the_postgresql_pass_runs_every_test_touching_a_database_and_only_those(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("CI", raising=False)  # no service is deselected for being absent here
    pytester.makeconftest((REPO / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    django_db: x\n    postgres: x\n    redis: x\n    uses_database: x\n")
    pytester.makepyfile("""
import pytest

@pytest.fixture
def db():
    return None

@pytest.mark.django_db
def test_marked():
    assert True

def test_with_the_db_fixture(db):
    assert True

@pytest.mark.uses_database
def test_handing_database_url_to_a_process():
    assert True

@pytest.mark.redis
def test_on_redis():
    assert True

def test_pure():
    assert True
""")
    everything = pytester.runpytest_subprocess("-p", "no:django")
    everything.assert_outcomes(passed=5)
    postgres_pass = pytester.runpytest_subprocess("-p", "no:django", "--database-tests-only", "-v")
    postgres_pass.assert_outcomes(passed=4, deselected=1)
    assert "test_pure" not in postgres_pass.stdout.str().replace("deselected", "")
