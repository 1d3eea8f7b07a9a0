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
