"""Suite-wide pytest rules.

Under CI=true no test may be skipped: a missing Slurm, CRIU, Chromium or database is a
failure there. Outside CI a skip must say how to get what is missing.
"""

from __future__ import annotations

import os
import tempfile

import pytest

# The evidence digest store lives outside the database; test databases start their ids afresh, so
# each session (and the workers and servers it starts) gets its own empty store.
os.environ["GPUSWEEP_EVIDENCE_DIGEST_DIR"] = tempfile.mkdtemp(prefix="gpusweep-digests-")

IN_CI = os.environ.get("CI", "").lower() == "true"
# The one skip CI allows: the end-to-end suite against a real Kubernetes cluster, which no CI
# machine has (tests/kube/test_real_cluster.py); its skip reason starts with this.
REAL_CLUSTER_SKIP = "end-to-end against a real Kubernetes cluster: set KUBECONFIG"


def _exempt(report: pytest.TestReport) -> bool:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
    return reason.removeprefix("Skipped: ").startswith(REAL_CLUSTER_SKIP)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not IN_CI or reporter is None:
        return
    skipped = [r for r in reporter.stats.get("skipped", []) if not _exempt(r)]
    if skipped:
        reporter.write_line(f"CI=true: {len(skipped)} test(s) skipped; skips are failures under CI", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def need(condition: bool, reason: str) -> None:
    """Skip with `reason` when `condition` is false (and so fail under CI)."""
    if not condition:
        pytest.skip(reason)


@pytest.fixture
def make_user(db: None):  # type: ignore[no-untyped-def]
    """make_user("vera", "viewer", ...) -> a user holding those roles, password "pw-<name>-12345"."""
    from django.contrib.auth.models import Group, User

    def _make(username: str, *roles: str) -> User:
        user = User.objects.create_user(username, password=f"pw-{username}-12345")
        for role in roles:
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        return user

    return _make


@pytest.fixture(autouse=True)
def no_leftover_processes(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """After a test with a tmp_path, kill any process still naming a file in it (a workload a
    real agent restored outlives the agent; the next tests must not share the machine with it)."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    folder = str(request.getfixturevalue("tmp_path"))
    yield
    import signal
    from pathlib import Path

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(folder.encode()) for arg in argv):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass
