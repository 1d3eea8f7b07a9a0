"""deploy/kubernetes/ against the Kubernetes OpenAPI schemas of 1.30 and the client's version (1.37), and what an
operator reviews in it: least RBAC, the agent's privileges, the network policy, the Secrets.

The schema comes from PyPI's kubernetes-validate (in requirements.txt), which ships the JSON
schemas generated from each Kubernetes release's OpenAPI document (strict: unknown fields are
errors), so no network is needed. Neither the kubernetes client (its models carry no schema
file) nor kubectl (it asks the server) carries them offline.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from tests.helpers import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
# The client's major version names the Kubernetes minor it was generated from (37.x: 1.37).
SCHEMA_VERSION = f"1.{kubernetes.__version__.split('.')[0]}.0"
# The oldest minor still in wide use on GPU clusters (managed offerings' extended support) and the
# client's: the manifests must be valid on both. kubernetes-validate bundles 1.30 and 1.37 (offline).
SCHEMA_VERSIONS = ("1.30.0", SCHEMA_VERSION)


def documents() -> list[tuple[Path, dict[str, Any]]]:
    """Every manifest: the base (kubectl apply -f deploy/kubernetes/) and the opt-in ones of optional/."""
    paths = [*sorted(DEPLOY.glob("*.yaml")), *sorted((DEPLOY / "optional").glob("*.yaml"))]
    return [(path, doc) for path in paths for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _path, doc in documents() if doc["kind"] == kind}


def test_the_schemas_of_both_versions_are_bundled() -> None:
    bundled = kubernetes_validate.utils.all_versions()
    assert set(SCHEMA_VERSIONS) <= set(bundled), bundled


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("path,doc", documents(), ids=lambda v: v.name if isinstance(v, Path) else
                         f"{v['kind']}/{v['metadata']['name']}")
def test_every_manifest_validates_strictly_against_each_kubernetes_schema(
        path: Path, doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_shipped_files_validate_with_the_kubernetes_validate_command() -> None:
    """The check an operator runs: `kubernetes-validate --strict -k <version> <files>`, exit status 0."""
    command = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert command is not None, "kubernetes-validate (requirements.txt) installs its command into the venv"
    files = sorted({str(path) for path, _doc in documents()})
    for version in SCHEMA_VERSIONS:
        done = subprocess.run([command, "--strict", "-k", version, *files], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, (version, done.stdout, done.stderr)
        assert "INFO" in done.stdout and "ERROR" not in done.stdout


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_the_validation_is_strict_about_unknown_fields(version: str) -> None:
    daemonset = by_kind("DaemonSet")["gpusweep-agent"]
    wrong = {**daemonset, "spec": {**daemonset["spec"], "hostPid": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, version, strict=True)


def test_rbac_is_the_least_the_executor_needs_and_the_agent_gets_none() -> None:
    def rules(role: str) -> dict[tuple[str, str], set[str]]:
        return {(group, resource): set(rule["verbs"]) for rule in by_kind("ClusterRole")[role]["rules"]
                for group in rule["apiGroups"] for resource in rule["resources"]}

    assert rules("gpusweep-executor") == {
        ("", "nodes"): {"get", "list", "watch", "patch"},
        ("", "pods"): {"get", "list", "create", "patch", "delete"}, ("", "pods/eviction"): {"create"},
        ("", "persistentvolumeclaims"): {"get", "list", "patch"}, ("apps", "replicasets"): {"get"},
        ("", "persistentvolumes"): {"get", "list"}, ("storage.k8s.io", "storageclasses"): {"get", "list"},
        ("apps", "replicasets/finalizers"): {"update"},
        ("resource.k8s.io", "resourceclaims"): {"list"},
        ("nvidia.com", "clusterpolicies"): {"get", "list", "patch"},
        ("nvidia.com", "nvidiadrivers"): {"get", "list", "patch"},
    }
    # Root on every node: only in the opt-in role, outside what `kubectl apply -f deploy/kubernetes/` applies;
    # with it, the container logs in which a restored workload's progress marker is read.
    assert rules("gpusweep-kubelet-checkpoint") == {("", "nodes/proxy"): {"create"}, ("", "pods/log"): {"get"}}
    assert not any(doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "gpusweep-kubelet-checkpoint"
                   for path in DEPLOY.glob("*.yaml") for doc in yaml.safe_load_all(path.read_text()) if doc)
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


HOST = ["nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--"]


def test_the_agent_installs_packages_and_reboots_in_the_hosts_namespaces() -> None:
    """The DaemonSet's settings read by the agent's own configuration loader: every command the package
    method would run for each component it knows, the livepatch and the reboot go through nsenter into PID 1's
    namespaces (the node's, with hostPID), and the OS files are read under the node's root, so they change
    and read the node and not the container."""
    from gpusweep_agent.config import load_config
    from gpusweep_agent.patch import DEFAULT_TEMPLATES, get_patch_method
    from gpusweep_agent.util import host_argv

    spec = by_kind("DaemonSet")["gpusweep-agent"]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["containers"][0]["securityContext"]["privileged"] is True
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"] if "value" in e}
    config = load_config(environ={**env, "GPUSWEEP_AGENT_KEY": "k" * 64, "GPUSWEEP_AGENT_NODE": "gpu-1"})
    assert host_argv(config, shlex.split(config.reboot_command)) == [*HOST, "systemctl", "reboot"]
    package = get_patch_method("package", config)
    for component in DEFAULT_TEMPLATES:
        argv = host_argv(config, package.command(component, "570.195.03"))
        assert argv[:len(HOST)] == HOST and argv[len(HOST)] == "apt-get", (component, argv)
    assert host_argv(config, package.command("driver", "570.195.03")) == [
        *HOST, "apt-get", "install", "-y", "--no-install-recommends", "nvidia-driver-570=570.195.03"]
    assert host_argv(config, get_patch_method("livepatch", config).command("livepatch", "99"))[:len(HOST)] == HOST
    assert str(config.host_root) == "/proc/1/root"  # PID 1's root: the node's, with hostPID


def test_workload_pods_reach_the_agent_through_a_host_path_socket_not_the_network() -> None:
    spec = by_kind("DaemonSet")["gpusweep-agent"]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    socket = Path(env["GPUSWEEP_AGENT_SOCKET"])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(socket.parent))
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == str(socket.parent) and not mount.get("readOnly")
    # The port stays the worker's alone.
    [rule] = by_kind("NetworkPolicy")["gpusweep-agent"]["spec"]["ingress"]
    assert len(rule["from"]) == 1 and "app.kubernetes.io/component" in rule["from"][0]["podSelector"]["matchLabels"]
