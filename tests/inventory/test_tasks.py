"""Celery tasks and the beat schedule. Tasks run eagerly here (same code path the worker runs);
the Kubernetes API is tests/kube/apiserver.py over TLS (no API server can run here)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler
from rest_framework.test import APIClient

from gpusweep.celery import app
from inventory.choices import ClusterKind
from inventory.models import Cluster, Node
from inventory.tasks import sync_all_clusters, sync_cluster_task
from tests.kube.apiserver import KubeApiServer
from tests.kube.objects import gpu_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def kube(monkeypatch, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    app.conf.task_always_eager = True
    monkeypatch.setenv("GPUSWEEP_TEST_KUBE_TOKEN", "t0ken")
    with KubeApiServer(token="t0ken") as api:
        api.nodes = [gpu_node("n1"), gpu_node("n2")]
        yield api
    app.conf.task_always_eager = False


def cluster(api: KubeApiServer, name: str = "prod", **extra) -> Cluster:
    return Cluster.objects.create(name=name, kind=ClusterKind.KUBERNETES,
                                  connection={"host": api.url, "ca_cert": str(api.ca_path)},
                                  secret_env={"token": "GPUSWEEP_TEST_KUBE_TOKEN"}, **extra)


def test_the_sync_task_takes_an_id_and_is_idempotent(kube):
    prod = cluster(kube)
    assert sync_cluster_task(prod.pk)["added"] == 2
    again = sync_cluster_task(prod.pk)
    assert (again["added"], again["changed"], again["removed"]) == (0, 0, 0)
    assert sync_cluster_task(999_999) == {"skipped": "cluster missing or sync disabled"}


def test_the_sync_task_records_a_failure_on_the_cluster(kube):
    prod = cluster(kube)
    kube.fail_status = 500
    assert "HTTP 500" in sync_cluster_task(prod.pk)["error"]
    assert "HTTP 500" in Cluster.objects.get(pk=prod.pk).last_sync_error


def test_sync_all_queues_every_enabled_scheduler_cluster(kube):
    cluster(kube, "prod")
    cluster(kube, "paused", sync_enabled=False)
    Cluster.objects.create(name="files", kind=ClusterKind.STATIC)
    assert sync_all_clusters() == 1
    assert set(Node.objects.values_list("cluster__name", flat=True)) == {"prod"}


def test_beat_creates_the_periodic_inventory_sync():
    DatabaseScheduler(app=app).setup_schedule()
    task = PeriodicTask.objects.get(name="inventory-sync")
    assert task.task == "inventory.tasks.sync_all_clusters" and task.enabled
    assert task.interval is not None and task.interval.every == 300
    assert "inventory.tasks.sync_all_clusters" in app.tasks


def test_an_admin_can_queue_a_sync_through_the_api(kube):
    prod = cluster(kube)
    admin = User.objects.create_user("ada", password="pw-12345678")
    admin.groups.add(Group.objects.get(name="admin"))
    client = APIClient()
    client.force_authenticate(admin)
    response = client.post(f"/api/v1/inventory/clusters/{prod.pk}/sync/")
    assert response.status_code == 202
    assert Node.objects.filter(cluster=prod).count() == 2
