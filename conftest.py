"""Suite-wide pytest rules.

Under CI=true no test may be skipped: a missing Slurm, CRIU, Chromium or database is a
failure there. Outside CI a skip must say how to get what is missing. The one exception is a
service the pass is not configured for: .ci/run runs the suite once on the embedded SQLite
default and once on PostgreSQL + Redis, and a test marked `postgres` or `redis` is deselected
(not skipped) in the pass without that service; in the other pass it runs, and a skip fails.

Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`) the tests that share one
outside resource (a real Slurm cluster, CRIU, a browser) run on one worker, one after another.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
# The one skip CI allows: the end-to-end suite against a real Kubernetes cluster, which no CI
# machine has (tests/kube/test_real_cluster.py); its skip reason starts with this.
REAL_CLUSTER_SKIP = "end-to-end against a real Kubernetes cluster: set KUBECONFIG"
# marker -> (the environment variable that configures the service, the URL schemes it takes)
SERVICES = {"postgres": ("DATABASE_URL", ("postgres", "pgsql")), "redis": ("CELERY_BROKER_URL", ("redis",))}
# marker -> xdist group, the first that matches: tests sharing an outside resource, one at a time.
GROUPS = ("slurm", "criu", "browser")
# Files using CRIU (or its restore of real processes) without the criu marker on every test.
CRIU_FILES = ("tests/campaigns/test_kubernetes_campaign.py",)


def _missing_services() -> set[str]:
    return {mark for mark, (name, schemes) in SERVICES.items() if not os.environ.get(name, "").startswith(schemes)}


def pytest_configure(config: pytest.Config) -> None:
    """One fast hasher in the test process: each user made with the default PBKDF2 costs ~0.6 s
    of CPU. Processes a test starts keep the real hashers (they hash and check their own users)."""
    from django.conf import settings

    if settings.configured:
        from django.contrib.auth import hashers

        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
        hashers.get_hashers.cache_clear()
        hashers.get_hashers_by_algorithm.cache_clear()


def pytest_report_header(config: pytest.Config) -> str | None:
    missing = sorted(_missing_services())
    if IN_CI and missing:
        return f"CI=true: tests marked {' or '.join(missing)} are deselected (.ci/run's PostgreSQL pass runs them)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = next((mark for mark in GROUPS if item.get_closest_marker(mark)), None)
        if group is None and item.nodeid.startswith(CRIU_FILES):
            group = "criu"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    missing = _missing_services() if IN_CI else set()
    unserved = [item for item in items if any(item.get_closest_marker(mark) for mark in missing)]
    if unserved:
        config.hook.pytest_deselected(items=unserved)
        dropped = set(map(id, unserved))
        items[:] = [item for item in items if id(item) not in dropped]


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
