from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.test import APIClient

from inventory.choices import ChangeSource, ClusterKind, ServiceState, WorkloadKind
from inventory.models import ChangeLog, Cluster, Node
from inventory.services import ObservedNode, ObservedWorkload, Snapshot, apply_snapshot

pytestmark = pytest.mark.django_db

BASE = "/api/v1/inventory"


def user_with(role: str) -> APIClient:
    user = User.objects.create_user(f"{role}-user", password="pw-12345678")
    user.groups.add(Group.objects.get(name=role))
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def fleet() -> Cluster:
    cluster = Cluster.objects.create(name="hpc", kind=ClusterKind.SLURM)
    other = Cluster.objects.create(name="k8s", kind=ClusterKind.KUBERNETES)
    drivers = {"a": "570.9", "b": "570.86.15", "c": "570.195.03", "d": "535.274.02", "e": "custom-build"}
    apply_snapshot(cluster, Snapshot(
        nodes=[ObservedNode(name, components={"driver": v}, pool="big" if name < "c" else "small",
                            gpu_model="H100", gpu_count=8) for name, v in drivers.items()],
        workloads=[ObservedWorkload(WorkloadKind.SLURM_JOB, "42", node="a", gpus=4)],
    ), ChangeSource.SLURM)
    apply_snapshot(other, Snapshot(nodes=[ObservedNode("x", components={"driver": "580.95.05"}, gpu_model="L40S")]),
                   ChangeSource.KUBERNETES)
    return cluster


def names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return sorted(n["name"] for n in response.json()["results"])


def test_it_filters_nodes_by_driver_version_range_compared_numerically(fleet):
    viewer = user_with("viewer")
    url = f"{BASE}/nodes/?component=driver&version_gte=570.0&version_lt=570.195.03"
    assert names(viewer.get(url)) == ["a", "b"]  # 570.9 < 570.86.15 < 570.195.03
    assert names(viewer.get(f"{BASE}/nodes/?component=driver&version_gt=570.9")) == ["b", "c", "x"]
    assert names(viewer.get(f"{BASE}/nodes/?branch=R570")) == ["a", "b", "c"]
    assert names(viewer.get(f"{BASE}/nodes/?component=driver&flagged=true")) == ["e"]


def test_it_filters_nodes_by_cluster_pool_model_and_state(fleet):
    viewer = user_with("viewer")
    Node.objects.filter(name="b").update(service_state=ServiceState.DRAINING)
    assert names(viewer.get(f"{BASE}/nodes/?cluster=k8s")) == ["x"]
    assert names(viewer.get(f"{BASE}/nodes/?cluster=hpc&pool=big")) == ["a", "b"]
    assert names(viewer.get(f"{BASE}/nodes/?gpu_model=L40S")) == ["x"]
    assert names(viewer.get(f"{BASE}/nodes/?state=draining")) == ["b"]
    node = viewer.get(f"{BASE}/nodes/?cluster=hpc&name=a").json()["results"][0]
    assert node["components"][0]["component"] == "driver" and node["components"][0]["branch"] == "R570"


def test_it_explains_bad_version_filters(fleet):
    viewer = user_with("viewer")
    response = viewer.get(f"{BASE}/nodes/?component=driver&version_lt=latest")
    assert response.status_code == 400 and "not a comparable driver version" in str(response.json())
    assert viewer.get(f"{BASE}/nodes/?version_lt=570.1").status_code == 400


def test_viewers_read_and_only_admins_write(fleet):
    viewer, admin = user_with("viewer"), user_with("admin")
    assert viewer.get(f"{BASE}/clusters/").status_code == 200
    assert viewer.get(f"{BASE}/workloads/?node=a").json()["results"][0]["scheduler_id"] == "42"
    assert viewer.get(f"{BASE}/changes/?source=kubernetes").json()["count"] == 1
    body = {"name": "lab", "kind": "static"}
    assert viewer.post(f"{BASE}/clusters/", body, format="json").status_code == 403
    assert admin.post(f"{BASE}/clusters/", body, format="json").status_code == 201
    node = Node.objects.get(name="a")
    assert viewer.patch(f"{BASE}/nodes/{node.pk}/", {"pool": "x"}, format="json").status_code == 403
    response = admin.patch(f"{BASE}/nodes/{node.pk}/", {"pool": "reserved", "gpu_count": 1}, format="json")
    assert response.status_code == 200
    node.refresh_from_db()
    assert (node.pool, node.gpu_count) == ("reserved", 8)  # observed fields stay with their source
    entry = ChangeLog.objects.filter(source=ChangeSource.API).get()
    assert entry.changes == {"pool": ["big", "reserved"]} and entry.user is not None


def test_it_refuses_secret_values_in_cluster_settings():
    admin = user_with("admin")
    body = {"name": "prod", "kind": "kubernetes", "connection": {"host": "https://k8s:6443"},
            "secret_env": {"token": "eyJhbGciOiJSUzI1NiIsImtpZCI6"}}
    response = admin.post(f"{BASE}/clusters/", body, format="json")
    assert response.status_code == 400 and "environment variable" in str(response.json())
    body["secret_env"] = {"token": "GPUSWEEP_SECRET_KUBE_TOKEN_PROD"}
    leaked = {**body, "connection": {"host": "https://k8s:6443", "bearer_token": "eyJhbGci"}}
    response = admin.post(f"{BASE}/clusters/", leaked, format="json")
    assert response.status_code == 400 and "bearer_token: secrets never go in the database" in str(response.json())
    assert admin.post(f"{BASE}/clusters/", body, format="json").status_code == 201
