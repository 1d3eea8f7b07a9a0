"""deploy/kubernetes/ against the Kubernetes OpenAPI schema of the client's version, and what an
operator reviews in it: least RBAC, the agent's privileges, the network policy, the Secrets.

The schema comes from PyPI's kubernetes-validate (in requirements.txt), which ships the JSON
schemas generated from each Kubernetes release's OpenAPI document (strict: unknown fields are
errors), so no network is needed. Neither the kubernetes client (its models carry no schema
file) nor kubectl (it asks the server) carries them offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import pytest
import yaml

from tests.helpers import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
# The client's major version names the Kubernetes minor it was generated from (37.x: 1.37).
SCHEMA_VERSION = f"1.{kubernetes.__version__.split('.')[0]}.0"


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in sorted(DEPLOY.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
            if doc]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _path, doc in documents() if doc["kind"] == kind}


@pytest.mark.parametrize("path,doc", documents(), ids=lambda v: v.name if isinstance(v, Path) else
                         f"{v['kind']}/{v['metadata']['name']}")
def test_every_manifest_validates_against_the_clients_kubernetes_schema(path: Path, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)


def test_the_validation_is_strict_about_unknown_fields() -> None:
    daemonset = by_kind("DaemonSet")["gpusweep-agent"]
    wrong = {**daemonset, "spec": {**daemonset["spec"], "hostPid": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, SCHEMA_VERSION, strict=True)


def test_rbac_is_the_least_the_executor_needs_and_the_agent_gets_none() -> None:
    rules = {(group, resource): set(rule["verbs"]) for rule in by_kind("ClusterRole")["gpusweep-executor"]["rules"]
             for group in rule["apiGroups"] for resource in rule["resources"]}
    assert rules == {
        ("", "nodes"): {"get", "list", "watch", "patch"}, ("", "nodes/proxy"): {"create"},
        ("", "pods"): {"get", "list", "create", "patch"}, ("", "pods/eviction"): {"create"},
        ("", "persistentvolumeclaims"): {"get", "list", "patch"}, ("apps", "replicasets"): {"get"},
        ("resource.k8s.io", "resourceclaims"): {"list"},
        ("nvidia.com", "clusterpolicies"): {"get", "list", "patch"},
        ("nvidia.com", "nvidiadrivers"): {"get", "list", "patch"},
    }
    subjects = [s for b in by_kind("ClusterRoleBinding").values() for s in b["subjects"]]
    subjects += [s for b in by_kind("RoleBinding").values() for s in b["subjects"]]
    assert {s["name"] for s in subjects} == {"gpusweep"}
    assert by_kind("ServiceAccount")["gpusweep-agent"]["automountServiceAccountToken"] is False


def test_the_agent_is_privileged_with_host_pid_and_only_the_worker_reaches_its_port() -> None:
    spec = by_kind("DaemonSet")["gpusweep-agent"]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["hostPID"] is True and container["securityContext"]["privileged"] is True
    assert spec["serviceAccountName"] == "gpusweep-agent" and not spec.get("hostNetwork")
    port = container["ports"][0]["containerPort"]
    policy = by_kind("NetworkPolicy")["gpusweep-agent"]["spec"]
    assert policy["podSelector"]["matchLabels"] == by_kind("DaemonSet")["gpusweep-agent"]["spec"]["selector"][
        "matchLabels"]
    assert policy["policyTypes"] == ["Ingress"] and [p["port"] for p in policy["ingress"][0]["ports"]] == [port]
    allowed = policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    worker = by_kind("Deployment")["gpusweep-worker"]["spec"]["template"]["metadata"]["labels"]
    assert allowed.items() <= worker.items()
    assert not allowed.items() <= by_kind("Deployment")["gpusweep-web"]["spec"]["template"]["metadata"][
        "labels"].items()


def test_web_worker_and_beat_take_postgresql_and_redis_from_secrets() -> None:
    deployments = by_kind("Deployment")
    assert set(deployments) == {"gpusweep-web", "gpusweep-worker", "gpusweep-beat"}
    assert deployments["gpusweep-beat"]["spec"]["replicas"] == 1
    for deployment in [*deployments.values(), by_kind("Job")["gpusweep-migrate"]]:
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        secrets = {s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s}
        assert {"gpusweep-postgres", "gpusweep-redis", "gpusweep"} <= secrets
        assert not any(e.get("name") in ("DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY") and "value" in e
                       for e in container.get("env") or [])
    assert by_kind("Secret") == {}, "no Secret with values lives in the repository"
