"""Suite-wide pytest rules.

Under CI=true no test may be skipped: a missing Slurm, CRIU, Chromium or database is a
failure there. Outside CI a skip must say how to get what is missing. The one exception is a
service the pass is not configured for: .ci/run runs the suite once on the embedded SQLite
default and once on PostgreSQL + Redis, and a test marked `postgres` or `redis` is deselected
(not skipped) in the pass without that service; in the other pass it runs, and a skip fails.

Under pytest-xdist the test files that share one outside resource (a real Slurm cluster, CRIU, a
browser, real worker processes with timing bounds: GROUPS) run on one worker, one test after
another. `make pytest` goes further and runs them in phases of their own, after the others
(`--resource-groups without` on every core; then the LANES side by side, one process each, then
`alone` in one process): their timing bounds hold with nothing but the other lanes beside them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import pytest

# The evidence digest store lives outside the database; test databases start their ids afresh, so
# each session (and the workers and servers it starts) gets its own empty store.
os.environ["GPUSWEEP_EVIDENCE_DIGEST_DIR"] = tempfile.mkdtemp(prefix="gpusweep-digests-")

IN_CI = os.environ.get("CI", "").lower() == "true"
# The one skip CI allows: the end-to-end suite against a real Kubernetes cluster, which no CI
# machine has (tests/kube/test_real_cluster.py); its skip reason starts with this.
REAL_CLUSTER_SKIP = "end-to-end against a real Kubernetes cluster: set KUBECONFIG"
# marker -> (the environment variable that configures the service, the URL schemes it takes)
SERVICES = {"postgres": ("DATABASE_URL", ("postgres", "pgsql")), "redis": ("CELERY_BROKER_URL", ("redis",))}
# xdist group -> test files that need an outside resource of their own or a quiet machine: one
# worker runs a group's files one test after another. By file, because the xdist controller sees
# node ids only (and xdist 3.8's own xdist_group marks do nothing under pytest 9, which ignores the
# node id it rewrites).
# The LANES share no outside resource and run side by side, each in a process and test database of
# its own: each Slurm file starts a cluster of its own (its own munged, ports, spool folders and
# slurmdbd database in the machine's MariaDB), and their tests mostly wait on jobs; CRIU, the agents,
# the Kubernetes stand-in and each lane's browser share nothing either. This host plays every Slurm
# node of every cluster: an agent lists only the Slurm steps whose cgroup names its node
# (multiple-slurmd), and the demo's agents, named as the Slurm fleets' nodes, list no Slurm step or
# pod at all. The files are spread by their measured durations so that the lanes take about as
# long. Fresh-clone CI of f3f288d (SQLite / PostgreSQL pass): slurm 248/258 s, slurm-executor
# 276/59, demo 219/150, agents-browser 318/235; then the boot test (26/15 s) and the walk in the
# browser (12/13 s) moved from agents-browser to demo. test_contract_slurm and test_slurm_accounting
# touch no database, so they weigh on the SQLite pass only. `alone`, last: real Celery workers
# killed mid-campaign and the heartbeat flush, whose timing bounds failed with anything beside them
# on the 2-core machine.
GROUPS = {
    "slurm": ("tests/campaigns/test_slurm_campaign.py", "tests/inventory/test_slurm_sync.py",
              "tests/campaigns/test_kubernetes_volumes.py"),
    "slurm-executor": ("tests/executors/test_contract_slurm.py", "tests/costs/test_slurm_accounting.py",
                       "tests/ui/test_narrow_browser.py"),
    "demo": ("tests/campaigns/test_demo_ui.py", "tests/costs/test_slurm_campaign_vs_simulator.py",
             "tests/executors/test_kubelet_checkpoint_image.py", "tests/foundation/test_boot.py",
             "tests/ui/test_walk_browser.py"),
    "agents-browser": ("agent/tests/test_agent_checkpoint.py", "agent/tests/test_agent_cuda.py",
                       "agent/tests/test_agent_lazy.py", "agent/tests/test_agent_container_restore.py",
                       "tests/campaigns/test_kubernetes_campaign.py", "tests/campaigns/test_kubernetes_rbac.py",
                       "tests/costs/test_charts_browser.py", "tests/foundation/test_ui.py",
                       "tests/oidc/test_sso_browser.py",
                       "tests/ui/test_wizard_browser.py", "tests/campaigns/test_slurm_untyped_campaign.py"),
    "alone": ("tests/campaigns/test_e2e.py", "tests/faults/test_faults.py", "tests/inventory/test_heartbeat_digest.py"),
}
LANES = ("slurm", "slurm-executor", "demo", "agents-browser")  # scripts/pytest-phases.sh names them too
MARKED_GROUPS = ("slurm", "criu", "browser")  # a test with one of these marks must be in a file of GROUPS
GROUP_OF_FILE = {path: group for group, paths in GROUPS.items() for path in paths}


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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadgroup: each group of GROUPS is one scope (one worker); every other test its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ResourceGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return GROUP_OF_FILE.get(nodeid.split("::", 1)[0], nodeid)

    return ResourceGroups(config, log)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--resource-groups", choices=("with", "without", "only", "lanes", *LANES, "alone"),
                     default="with",
                     help="the test files of conftest.GROUPS: run with the others (default), leave them out, "
                          "run only them, only those of LANES, of one lane, or only the others (make pytest: "
                          "`without` on every core, then each lane in a process of its own side by side, "
                          "then `alone` in one process)")
    parser.addoption("--database-tests-only", action="store_true",
                     help="only the tests that touch the configured database or broker (conftest.touches_database): "
                          "make test-postgres, after the whole suite ran on the SQLite default")


def _keep(config: pytest.Config, items: list[pytest.Item], keep: Callable[[pytest.Item], bool]) -> None:
    dropped = [item for item in items if not keep(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    strays = sorted({item.nodeid.split("::", 1)[0] for item in items if item.nodeid.split("::", 1)[0]
                     not in GROUP_OF_FILE and any(item.get_closest_marker(mark) for mark in MARKED_GROUPS)})
    if strays:
        raise pytest.UsageError(f"add {', '.join(strays)} to conftest.GROUPS: its tests share a Slurm cluster, "
                                "CRIU or the browser with others, so they must run on one xdist worker")
    missing = _missing_services() if IN_CI else set()
    _keep(config, items, lambda item: not any(item.get_closest_marker(mark) for mark in missing))
    if config.getoption("database_tests_only"):
        _keep(config, items, touches_database)
    groups = config.getoption("resource_groups")
    if groups != "with":
        _keep(config, items, lambda item: _in_phase(GROUP_OF_FILE.get(item.nodeid.split("::", 1)[0]), groups))


def _in_phase(group: str | None, phase: str) -> bool:
    if phase == "without":
        return group is None
    if phase == "only":
        return group is not None
    if phase in LANES:
        return group == phase
    return group is not None and (group in LANES) == (phase == "lanes")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None,
                                 request: pytest.FixtureRequest) -> None:
    """A lane's own test database (test_<name>_<lane>): make pytest runs the LANES side by side,
    processes that would otherwise all create and drop test_<name> on PostgreSQL."""
    lane = request.config.getoption("resource_groups")
    if lane in LANES:
        from pytest_django.fixtures import _set_suffix_to_test_databases

        _set_suffix_to_test_databases(lane.replace("-", "_"))


# What a test that touches the configured database or broker uses (besides the django_db mark and the
# postgres, redis and uses_database marks): `make test-postgres` runs only these, since every other
# test reads neither DATABASE_URL nor CELERY_BROKER_URL and ran, identically, in the SQLite pass.
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                               "live_server", "client", "admin_client", "admin_user", "django_user_model"})
DATABASE_MARKS = ("django_db", "postgres", "redis", "uses_database")


def touches_database(item: pytest.Item) -> bool:
    return (any(item.get_closest_marker(mark) for mark in DATABASE_MARKS)
            or bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))))


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
