"""A kubelet stand-in per node: runs the containers of the pods bound to its node as real processes.

No container runtime can run here, so a container is its ``command`` + ``args`` run as a process
in its own session, with its environment resolved as the kubelet does (``value``, and
``valueFrom.fieldRef`` for the pod's name, namespace, uid, node name, labels and annotations; a
container without a command, whose image would run here, is a process that sleeps),
plus the node agent's settings (``agent_env``: in a cluster the agent DaemonSet hands them to pods
through its hostPath). Each start writes its own log file (like ``/var/log/pods/.../<n>.log``), a
container that exits is restarted after a back-off under ``restartPolicy`` Always/OnFailure, a
pod being deleted has its processes stopped and is then removed. A pod whose ReadWriteOnce claim is
still used by a pod on another node waits in ContainerCreating (the Multi-Attach error) until that pod
is gone. Status (phase, conditions,
containerStatuses with restart counts) is written as the kubelet reports it.

The node proxy answers the ContainerCheckpoint call (``POST /checkpoint/{ns}/{pod}/{container}``)
the way the kubelet does, ``{"items": [<archive path>]}``, writing an archive that names the
container's process; with ``checkpoint_enabled=False`` it answers 404 as a kubelet without the
feature does, and with ``runtime_checkpoints=False`` 500 with the CRI's Unimplemented error, as a
kubelet with the feature over a runtime that cannot checkpoint (containerd before 1.7's CRI
checkpoint support, for one) does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kube.apiserver import KubeApiServer, set_condition, single_node_claims
from tests.kube.machinery import now


@dataclass
class Container:
    proc: subprocess.Popen[bytes] | None
    started_at: str
    restarts: int = 0
    exit_code: int | None = None
    next_start: float = 0.0
    log: Path | None = None
    history: list[int] = field(default_factory=list)


class Kubelet:
    def __init__(self, api: KubeApiServer, node: str, folder: Path, *, agent_env: dict[str, str] | None = None,
                 runtime: str = "containerd://2.1.4", backoff_s: float = 0.5, checkpoint_enabled: bool = True,
                 host_ip: str = "127.0.0.1", runtime_checkpoints: bool = True) -> None:
        self.api, self.node, self.folder = api, node, folder
        self.agent_env = agent_env or {}
        self.runtime, self.backoff_s, self.checkpoint_enabled, self.host_ip = runtime, backoff_s, checkpoint_enabled, \
            host_ip
        self.runtime_checkpoints = runtime_checkpoints
        self.containers: dict[tuple[str, str], Container] = {}
        self.checkpoints: list[Path] = []
        folder.mkdir(parents=True, exist_ok=True)
        api.managed_nodes.add(node)
        api.node_proxies[node] = self.proxy
        api.mutate("nodes", node, "", self._report_node)
        api.controllers.append(self)

    def _report_node(self, obj: dict[str, Any]) -> None:
        obj.setdefault("status", {}).setdefault("nodeInfo", {})["containerRuntimeVersion"] = self.runtime

    # -- the sync loop ---------------------------------------------------------------
    def tick(self) -> None:
        pods = [p for p in self.api.objects("pods") if (p.get("spec") or {}).get("nodeName") == self.node]
        alive = set()
        for pod in pods:
            alive.add(pod["metadata"]["uid"])
            self._sync(pod)
        for key in [k for k in self.containers if k[0] not in alive]:
            self._stop(self.containers.pop(key))

    def _sync(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        if meta.get("deletionTimestamp"):
            for name in [c["name"] for c in spec.get("containers") or []]:
                container = self.containers.pop((uid, name), None)
                if container:
                    self._stop(container, float(meta.get("deletionGracePeriodSeconds") or 2))
            self.api.remove("pods", meta["name"], meta["namespace"])
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return
        blocked = self._attached_elsewhere(pod)
        if blocked and not any(k[0] == uid for k in self.containers):
            def waiting(obj: dict[str, Any]) -> None:
                obj.setdefault("status", {}).update(phase="Pending", containerStatuses=[{
                    "name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                    "state": {"waiting": {"reason": "ContainerCreating", "message": blocked}}}
                    for c in spec.get("containers") or []])
            if not self.api.happened("multi-attach", f"{meta['namespace']}/{meta['name']} {uid}"):
                self.api.record("multi-attach", f"{meta['namespace']}/{meta['name']} {uid}")
            self.api.mutate("pods", meta["name"], meta["namespace"], waiting)
            return
        policy = spec.get("restartPolicy", "Always")
        statuses = []
        for index, cspec in enumerate(spec.get("containers") or []):
            key = (uid, cspec["name"])
            container = self.containers.get(key)
            if container is None:
                container = self.containers[key] = self._start(pod, cspec, 0)
            elif container.proc is not None and container.proc.poll() is not None:
                container.exit_code = container.proc.returncode
                container.history.append(container.exit_code)
                container.proc = None
                container.next_start = time.monotonic() + self.backoff_s * 2 ** min(container.restarts, 4)
            if container.proc is None and (policy == "Always" or (policy == "OnFailure" and container.exit_code)):
                if time.monotonic() >= container.next_start:
                    container = self.containers[key] = self._start(pod, cspec, container.restarts + 1, container)
            statuses.append(self._container_status(cspec, container, index, policy))
        running = all(s["ready"] for s in statuses)
        finished = all("terminated" in s["state"] for s in statuses) and policy != "Always"
        new_phase = "Running"
        if finished:
            new_phase = "Succeeded" if all(s["state"]["terminated"]["exitCode"] == 0 for s in statuses) else "Failed"

        def write(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            if status.get("phase") != new_phase:
                self.api.record(f"pod-{new_phase.lower()}", f"{meta['namespace']}/{meta['name']}")
            status.update(phase=new_phase, hostIP=self.host_ip, podIP=self.host_ip, containerStatuses=statuses)
            status.setdefault("startTime", now())
            status.pop("reason", None)
            for kind in ("Initialized", "PodScheduled"):
                set_condition(obj, kind, "True")
            set_condition(obj, "ContainersReady", "True" if running else "False")
            set_condition(obj, "Ready", "True" if running else "False")
        self.api.mutate("pods", meta["name"], meta["namespace"], write)

    def _attached_elsewhere(self, pod: dict[str, Any]) -> str:
        """Why the pod's volumes cannot attach here yet ("" when they can): a ReadWriteOnce claim still used by
        a pod on another node stays attached there until that pod is gone (the attach/detach controller's
        Multi-Attach error)."""
        claims = single_node_claims(self.api, pod)
        if not claims:
            return ""
        for other in self.api.objects("pods", pod["metadata"]["namespace"]):
            node = (other.get("spec") or {}).get("nodeName")
            if other["metadata"]["uid"] == pod["metadata"]["uid"] or node in (None, self.node) or (
                    other.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            shared = set(claims) & set(single_node_claims(self.api, other))
            if shared:
                return (f"Multi-Attach error for volume of claim {sorted(shared)[0]}: the volume is already used by "
                        f"pod {other['metadata']['name']} on {node}")
        return ""

    def _container_status(self, cspec: dict[str, Any], container: Container, index: int,
                          policy: str) -> dict[str, Any]:
        state: dict[str, Any]
        if container.proc is not None:
            state = {"running": {"startedAt": container.started_at}}
        elif policy == "Never" or (policy == "OnFailure" and not container.exit_code):
            state = {"terminated": {"exitCode": container.exit_code or 0, "reason": "Completed"
                                    if not container.exit_code else "Error", "finishedAt": now()}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting failed container "
                                 f"{cspec['name']} (exit code {container.exit_code})"}}
        return {"name": cspec["name"], "image": cspec.get("image", ""), "imageID": "", "ready": container.proc is not
                None, "started": container.proc is not None, "restartCount": container.restarts, "state": state,
                "containerID": f"{self.runtime.split(':')[0]}://{index}-{container.started_at}"}

    def _env(self, pod: dict[str, Any], cspec: dict[str, Any]) -> dict[str, str]:
        env = {**self.agent_env}
        meta = pod["metadata"]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                  "spec.nodeName": self.node, "status.hostIP": self.host_ip, "status.podIP": self.host_ip}
        for item in cspec.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
                continue
            path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
                if path.startswith(prefix + "["):
                    env[item["name"]] = (meta.get(source) or {}).get(path[len(prefix) + 2:-2], "")
            if path in fields:
                env[item["name"]] = fields[path]
        return env

    def _start(self, pod: dict[str, Any], cspec: dict[str, Any], restarts: int,
               previous: Container | None = None) -> Container:
        meta = pod["metadata"]
        folder = self.folder / f"{meta['namespace']}_{meta['name']}_{meta['uid']}" / cspec["name"]
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / f"{restarts}.log"
        # Images are not run here: a container without a command is a process that sleeps.
        argv = list(cspec.get("command") or []) + list(cspec.get("args") or []) or [
            sys.executable, "-c", "import time; time.sleep(86400)"]
        history = previous.history if previous else []
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env=self._env(pod, cspec), cwd=cspec.get("workingDir") or str(folder),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.api.record("container-started", f"{meta['namespace']}/{meta['name']} {self.node} {restarts}")
        return Container(proc=proc, started_at=now(), restarts=restarts, log=log, history=history)

    def _stop(self, container: Container, grace: float = 2.0) -> None:
        proc = container.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=min(grace, 5.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        for container in self.containers.values():
            self._stop(container, 1.0)

    # -- the kubelet API behind the node proxy ----------------------------------------
    def proxy(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[0] == "healthz":
            return 200, "ok"
        if parts[0] == "checkpoint" and len(parts) == 4 and method == "POST":
            if not self.checkpoint_enabled:
                return 404, "404 page not found\n"
            _, namespace, name, container_name = parts
            pod = self.api.get("pods", name, namespace)
            if pod is None or (pod.get("spec") or {}).get("nodeName") != self.node:
                return 404, f'pod "{namespace}/{name}" not found on {self.node}\n'
            container = self.containers.get((pod["metadata"]["uid"], container_name))
            if container is None or container.proc is None:
                return 500, f"checkpointing of {namespace}/{name}/{container_name} failed: container not running\n"
            if not self.runtime_checkpoints:
                return 500, (f"checkpointing of {namespace}/{name}/{container_name} failed (rpc error: code = "
                             "Unimplemented desc = method CheckpointContainer not implemented)\n")
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            archive = self.folder / "checkpoints" / f"checkpoint-{name}_{namespace}-{container_name}-{stamp}.tar"
            archive.parent.mkdir(parents=True, exist_ok=True)
            spec = self.folder / f"{archive.name}.json"
            spec.write_text(json.dumps({"pod": f"{namespace}/{name}", "container": container_name,
                                        "pid": container.proc.pid, "runtime": self.runtime}))
            with tarfile.open(archive, "w") as tar:
                tar.add(spec, arcname="spec.dump")
            spec.unlink()
            self.checkpoints.append(archive)
            # The kubelet's checkpoint is forensic: the container keeps running.
            return 200, {"items": [str(archive)]}
        return 404, "404 page not found\n"
