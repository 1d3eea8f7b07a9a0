"""The scheduled sync through real processes: celery beat fires `inventory.tasks.sync_all_clusters`
from django-celery-beat's table, a celery worker runs it and the per-cluster task, on PostgreSQL
and Redis. The Kubernetes API is tests/kube/apiserver.py over TLS (no API server can run
here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from conftest import need
from inventory.choices import ClusterKind
from inventory.models import Cluster, Node
from tests.helpers import REPO, clean_env, stop_process_group, wait_for
from tests.kube.apiserver import KubeApiServer
from tests.kube.objects import gpu_node

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "celery", "-A", "gpusweep", *args], env=env, cwd=REPO,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def test_beat_and_a_worker_keep_a_cluster_in_sync(tmp_path):
    need(os.environ.get("DATABASE_URL", "").startswith("postgres")
         and os.environ.get("CELERY_BROKER_URL", "").startswith("redis"),
         "set DATABASE_URL=postgres://root@127.0.0.1:5432/<db> and CELERY_BROKER_URL=redis://127.0.0.1:6379/<n> "
         "(as .ci/run does) to run the scheduled sync with real Celery beat and worker processes")
    db = connection.settings_dict
    env = clean_env(
        DATABASE_URL=f"postgres://{db['USER'] or 'root'}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"], GPUSWEEP_INVENTORY_SYNC_EVERY_S="5",
        GPUSWEEP_ADVISORY_SOURCES="", GPUSWEEP_TEST_KUBE_TOKEN="w0rker", GPUSWEEP_VAR_DIR=str(tmp_path),
    )
    log = tmp_path / "celery.log"
    with KubeApiServer(token="w0rker") as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2")]
        cluster = Cluster.objects.create(name="prod", kind=ClusterKind.KUBERNETES,
                                         connection={"host": api.url, "ca_cert": str(api.ca_path)},
                                         secret_env={"token": "GPUSWEEP_TEST_KUBE_TOKEN"})
        worker = _start(["worker", "--concurrency", "1", "--loglevel", "INFO", "--without-heartbeat",
                         "--without-mingle", "--without-gossip"], env, log)
        beat = _start(["beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "beat-schedule")], env, log)
        try:
            found = wait_for(lambda: Node.objects.filter(cluster=cluster).count() == 2, 90, interval=1)
            assert found, log.read_text()[-3000:]
            api.nodes = [gpu_node("n1", driver="580.95.05")]  # n2 leaves, n1 is upgraded
            moved = wait_for(lambda: Node.objects.filter(cluster=cluster, gone_at__isnull=False).count() == 1, 60,
                             interval=1)
            assert moved, log.read_text()[-3000:]
            assert Node.objects.get(name="n1").component_versions()["driver"] == "580.95.05"
            assert Cluster.objects.get(pk=cluster.pk).last_synced_at is not None
        finally:
            stop_process_group(beat)
            stop_process_group(worker)
