"""Issue 28 item 5: engine and executor names are checked against their registries when written (API
and admin); nothing a user writes is imported as a dotted path."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.forms import modelform_factory

from executors.base import get_executor
from inventory.admin import ClusterAdmin, WorkloadAdmin
from inventory.choices import ClusterKind, WorkloadKind
from inventory.models import Cluster, Workload
from tests.inventory.test_api import BASE, user_with

pytestmark = pytest.mark.django_db


def test_the_api_refuses_an_unregistered_executor_or_checkpoint_engine():
    admin = user_with("admin")
    cluster = Cluster.objects.create(name="prod", kind=ClusterKind.STATIC)
    for executor in ("nope", "os.system", "executors.memory.MemoryExecutor", 0):
        response = admin.patch(f"{BASE}/clusters/{cluster.pk}/", {"connection": {"executor": executor}}, format="json")
        assert response.status_code == 400 and "registered executors" in str(response.json()), executor
    ok = admin.patch(f"{BASE}/clusters/{cluster.pk}/", {"connection": {"executor": "memory"}}, format="json")
    assert ok.status_code == 200
    workload = Workload.objects.create(cluster=cluster, kind=WorkloadKind.SLURM_JOB, scheduler_id="1")
    for engine in ("bogus-engine", 0, None):
        response = admin.patch(f"{BASE}/workloads/{workload.pk}/", {"checkpoint_engine": engine}, format="json")
        assert response.status_code == 400, engine
    assert admin.patch(f"{BASE}/workloads/{workload.pk}/", {"checkpoint_engine": "criu"},
                       format="json").status_code == 200
    workload.refresh_from_db()
    assert workload.checkpoint_engine == "criu"


def test_a_dotted_path_written_to_a_cluster_is_never_imported():
    cluster = Cluster.objects.create(name="x", kind=ClusterKind.STATIC, connection={"executor": "os.system"})
    with pytest.raises(ImproperlyConfigured, match="not one of"):
        get_executor(cluster)
    cluster.connection = {"executor": "executors.memory.MemoryExecutor"}  # importable, still not a name
    with pytest.raises(ImproperlyConfigured, match="not one of"):
        get_executor(cluster)


def test_the_admin_refuses_them_too():
    cluster_form = modelform_factory(Cluster, form=ClusterAdmin.form, fields=["name", "kind", "connection",
                                                                              "secret_env"])
    bad = cluster_form(data={"name": "c", "kind": ClusterKind.STATIC,
                             "connection": '{"executor": "os.system"}', "secret_env": '{"token": "SECRET_KEY"}'})
    assert not bad.is_valid() and {"connection", "secret_env"} <= set(bad.errors)
    cluster = Cluster.objects.create(name="y", kind=ClusterKind.STATIC)
    workload = Workload.objects.create(cluster=cluster, kind=WorkloadKind.SLURM_JOB, scheduler_id="1")
    workload_form = modelform_factory(Workload, form=WorkloadAdmin.form, fields=["checkpoint_engine"])
    form = workload_form(data={"checkpoint_engine": "bogus-engine"}, instance=workload)
    assert not form.is_valid() and "checkpoint_engine" in form.errors
    assert workload_form(data={"checkpoint_engine": "criu"}, instance=workload).is_valid()
