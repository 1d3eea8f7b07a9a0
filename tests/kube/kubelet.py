"""A kubelet stand-in per node: runs the containers of the pods bound to its node as real processes.

No container runtime can run here, so a container is its ``command`` + ``args`` run as a process
in its own session, with its environment resolved as the kubelet does (``value``, and
``valueFrom.fieldRef`` for the pod's name, namespace, uid, node name, labels and annotations; a
container without a command, whose image would run here, is a process that sleeps),
plus the node agent's settings (``agent_env``: in a cluster the agent DaemonSet hands them to pods
through its hostPath). Each start gets a container id (64 hex digits, the status's ``containerID``) and,
as root, a cgroup named after it (``gpusweep-kubelet/<runtime>-<id>``, ``container_cgroup``) that the
process starts in, so the node's agent finds the container by that id as on a real node; what is left in it
when the container ends (a process restored into it) goes with it. The namespaces and root stay the host's
(agent/tests/test_agent_container_restore.py builds real ones). Each start writes its own log file (like
``/var/log/pods/.../<n>.log``), a
container that exits is restarted after a back-off under ``restartPolicy`` Always/OnFailure, a
pod being deleted has its processes stopped and is then removed. A pod whose ReadWriteOnce claim is
still used by a pod on another node waits in ContainerCreating (the Multi-Attach error) until that pod
is gone. Status (phase, conditions,
containerStatuses with restart counts) is written as the kubelet reports it.

The node proxy answers the ContainerCheckpoint call (``POST /checkpoint/{ns}/{pod}/{container}``)
the way the kubelet does, ``{"items": [<archive path>]}``, writing an archive laid out as CRI-O's
(``config.dump``, ``spec.dump``, ``checkpoint/``); with ``checkpoint_enabled=False`` it answers 404 as a
kubelet without the feature does, and with ``runtime_checkpoints=False`` 500 with the CRI's
Unimplemented error, as a kubelet with the feature over a runtime that cannot checkpoint does. It
also serves ``/containerLogs/{ns}/{pod}/{container}`` (what the API server's ``pods/log`` asks), the
current start's log.

No CRIU dump of a container runs here (the process is no container), so what the runtime's dump
would hold is the workload's own state: a container of a pod annotated ``gpusweep.io/checkpoint:
signal`` gets ``GPUSWEEP_CHECKPOINT_DIR`` and saves its state there on SIGUSR1 (the test counter's
protocol, tests' agent/tests/data/counter.py), which becomes the archive's ``checkpoint/``; the saved
process then idles, where a forensic dump would leave it running. With a ``registry`` (host:port,
plain HTTP) the stand-in pulls the images named there as a runtime does: a manifest that cannot be
had leaves the container waiting in ErrImagePull/ImagePullBackOff; a checkpoint image (its
``io.kubernetes.cri-o.annotations.checkpoint.name``) is restored, on a runtime that restores (CRI-O,
containerd 2.x; others fail it with CreateContainerError), by starting the container's command with
``GPUSWEEP_RESTORE_DIR`` at the image's ``checkpoint/``, so the workload continues from the saved state.
Images of other registries are taken as present.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors.checkpoint_image import CHECKPOINT_NAME, MANIFEST
from executors.kubernetes import restores_checkpoints
from tests.helpers import cgroup_base, cgroups_writable
from tests.kube.apiserver import KubeApiServer, set_condition, single_node_claims
from tests.kube.machinery import now

SAVE_TIMEOUT_S = 10.0


@dataclass
class Container:
    proc: subprocess.Popen[bytes] | None
    started_at: str
    restarts: int = 0
    exit_code: int | None = None
    next_start: float = 0.0
    log: Path | None = None
    history: list[int] = field(default_factory=list)
    waiting: tuple[str, str] | None = None  # (reason, message) while it cannot start: an image pull failing
    state_dir: Path | None = None  # where its workload saves its state (pods checkpointed by signal)
    id: str = ""  # the runtime's container id (64 hex digits), in its containerID and its cgroup's name
    cgroup: Path | None = None  # the cgroup its processes run in, named after the id as containerd names it


class Kubelet:
    def __init__(self, api: KubeApiServer, node: str, folder: Path, *, agent_env: dict[str, str] | None = None,
                 runtime: str = "containerd://2.1.4", backoff_s: float = 0.5, checkpoint_enabled: bool = True,
                 host_ip: str = "127.0.0.1", registry: str = "", checkpoint_dir: Path | None = None,
                 runtime_checkpoints: bool = True) -> None:
        self.api, self.node, self.folder, self.registry = api, node, folder, registry
        self.checkpoint_dir = checkpoint_dir or folder / "checkpoints"  # the node's /var/lib/kubelet/checkpoints
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
            if container is None or (container.waiting and time.monotonic() >= container.next_start):
                container = self.containers[key] = self._start(pod, cspec, 0, container)
            elif container.waiting:
                pass
            elif container.proc is not None and container.proc.poll() is not None:
                remove_cgroup(container.cgroup)  # the container's end takes what ran in it
                container.exit_code = container.proc.returncode
                container.history.append(container.exit_code)
                container.proc = None
                container.next_start = time.monotonic() + self.backoff_s * 2 ** min(container.restarts, 4)
            if container.proc is None and not container.waiting and (
                    policy == "Always" or (policy == "OnFailure" and container.exit_code)):
                if time.monotonic() >= container.next_start:
                    container = self.containers[key] = self._start(pod, cspec, container.restarts + 1, container)
            statuses.append(self._container_status(cspec, container, index, policy))
        running = all(s["ready"] for s in statuses)
        finished = all("terminated" in s["state"] for s in statuses) and policy != "Always"
        new_phase = "Running" if any(c.proc is not None or c.history for k, c in self.containers.items()
                                     if k[0] == uid) else "Pending"
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
        if container.waiting:
            state = {"waiting": {"reason": container.waiting[0], "message": container.waiting[1]}}
        elif container.proc is not None:
            state = {"running": {"startedAt": container.started_at}}
        elif policy == "Never" or (policy == "OnFailure" and not container.exit_code):
            state = {"terminated": {"exitCode": container.exit_code or 0, "reason": "Completed"
                                    if not container.exit_code else "Error", "finishedAt": now()}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off restarting failed container "
                                 f"{cspec['name']} (exit code {container.exit_code})"}}
        return {"name": cspec["name"], "image": cspec.get("image", ""), "imageID": "", "ready": container.proc is not
                None, "started": container.proc is not None, "restartCount": container.restarts, "state": state,
                "containerID": f"{self.runtime.split(':')[0]}://{container.id or index}"}

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
        env = self._env(pod, cspec)
        try:
            restore = self._pull(cspec, folder)
        except ImageError as exc:
            # The kubelet's image back-off: ErrImagePull first, ImagePullBackOff while it waits to retry.
            reason = "ImagePullBackOff" if previous is not None and previous.waiting else exc.reason
            self.api.record("image-pull-failed", f"{meta['namespace']}/{meta['name']} {cspec.get('image', '')}")
            return Container(proc=None, started_at="", waiting=(reason, str(exc)),
                             next_start=time.monotonic() + self.backoff_s * 4)
        if restore is not None:
            env["GPUSWEEP_RESTORE_DIR"] = str(restore)
            self.api.record("container-restored", f"{meta['namespace']}/{meta['name']} {self.node}")
        state_dir = None
        if (meta.get("annotations") or {}).get("gpusweep.io/checkpoint") == "signal":
            state_dir = folder / f"state-{restarts}"
            state_dir.mkdir(parents=True, exist_ok=True)
            env["GPUSWEEP_CHECKPOINT_DIR"] = str(state_dir)
        container_id = uuid.uuid4().hex + uuid.uuid4().hex
        cgroup = container_cgroup(f"{self.runtime.split(':')[0]}-{container_id}")

        def enter() -> None:
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env=env, cwd=cspec.get("workingDir") or str(folder),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=enter)
        self.api.record("container-started", f"{meta['namespace']}/{meta['name']} {self.node} {restarts}")
        return Container(proc=proc, started_at=now(), restarts=restarts, log=log, history=history,
                         state_dir=state_dir, id=container_id, cgroup=cgroup)

    def _pull(self, cspec: dict[str, Any], folder: Path) -> Path | None:
        """Pull the container's image when it is in this kubelet's registry; a checkpoint image is unpacked and
        its ``checkpoint/`` folder returned (what the workload restores from), else None."""
        image = str(cspec.get("image") or "")
        host, _, rest = image.partition("/")
        if not self.registry or host != self.registry:
            return None
        name, _, digest = rest.partition("@")
        repository, _, tag = name.rpartition(":") if ":" in name else (name, "", "latest")
        base = f"http://{self.registry}/v2/{repository}"
        manifest = json.loads(_fetch(f"{base}/manifests/{digest or tag}", MANIFEST, image))
        container = (manifest.get("annotations") or {}).get(CHECKPOINT_NAME)
        if container is None:
            return None
        if not restores_checkpoints(self.runtime):
            raise ImageError("CreateContainerError", f"{self.runtime} cannot restore checkpoint image {image}")
        if container != cspec["name"]:
            raise ImageError("CreateContainerError", f"checkpoint image {image} is of container {container}, not "
                             f"{cspec['name']}")
        target = folder / f"restore-{digest.replace(':', '-') or tag}"
        for layer in manifest.get("layers") or []:
            data = _fetch(f"{base}/blobs/{layer['digest']}", "*/*", image)
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(target, filter="data")
        return target / "checkpoint"

    def _stop(self, container: Container, grace: float = 2.0) -> None:
        proc = container.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=min(grace, 5.0))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        remove_cgroup(container.cgroup)

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
            saved = self._save(container)
            if isinstance(saved, str):
                return 500, f"checkpointing of {namespace}/{name}/{container_name} failed: {saved}\n"
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            archive = self.checkpoint_dir / f"checkpoint-{name}_{namespace}-{container_name}-{stamp}.tar"
            archive.parent.mkdir(parents=True, exist_ok=True)
            cspec = next(c for c in pod["spec"]["containers"] if c["name"] == container_name)
            argv = list(cspec.get("command") or []) + list(cspec.get("args") or [])
            dumps = {"config.dump": {"id": f"{pod['metadata']['uid']}-{container_name}", "name": container_name,
                                     "rootfsImageName": cspec.get("image", ""), "runtime": self.runtime,
                                     "createdTime": container.started_at},
                     "spec.dump": {"annotations": {"io.kubernetes.pod.name": name,
                                                   "io.kubernetes.pod.namespace": namespace,
                                                   "io.kubernetes.container.name": container_name},
                                   "process": {"args": argv},
                                   "pid": container.proc.pid}}
            with tarfile.open(archive, "w") as tar:
                for arcname, content in dumps.items():
                    data = json.dumps(content).encode()
                    info = tarfile.TarInfo(arcname)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                info = tarfile.TarInfo("checkpoint")
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                for state_file in saved:
                    tar.add(state_file, arcname=f"checkpoint/{state_file.name}")
            self.checkpoints.append(archive)
            return 200, {"items": [str(archive)]}
        if parts[0] == "containerLogs" and len(parts) == 4 and method == "GET":
            _, namespace, name, container_name = parts
            container_name, _, query = container_name.partition("?")
            pod = self.api.get("pods", name, namespace)
            found = self.containers.get((pod["metadata"]["uid"], container_name)) if pod else None
            if found is None or found.log is None:
                return 400, f'container "{container_name}" in pod "{name}" is waiting to start\n'
            lines = found.log.read_text(errors="replace").splitlines(keepends=True)
            tail = int(query.partition("tailLines=")[2] or 0) if "tailLines=" in query else 0
            return 200, "".join(lines[-tail:] if tail else lines)
        return 404, "404 page not found\n"

    @staticmethod
    def _save(container: Container) -> list[Path] | str:
        """What the dump holds: the files the workload saved on SIGUSR1 (a pod checkpointed by signal), else
        nothing; a reason when it did not save."""
        if container.state_dir is None or container.proc is None:
            return []
        ack = container.state_dir / ".gpusweep-ack"
        ack.unlink(missing_ok=True)
        os.kill(container.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + SAVE_TIMEOUT_S
        while not ack.exists():
            if time.monotonic() > deadline:
                return f"the workload saved no state in {SAVE_TIMEOUT_S:.0f} s"
            time.sleep(0.05)
        return [path for path in container.state_dir.iterdir() if path.name != ".gpusweep-ack"]


def container_cgroup(name: str) -> Path | None:
    """A cgroup for one container, named after its id as containerd names one (``<runtime>-<id>``), under
    ``gpusweep-kubelet`` in the hierarchy tests make cgroups in (``tests.helpers.cgroup_base``: the unified
    one on a cgroup v2 host, v1's pids on others): what lets the node's agent find a container by the id the
    pod's status names. None where none can be made (not root): the container then runs in the kubelet's."""
    if not cgroups_writable()[0]:
        return None
    cgroup = cgroup_base() / "gpusweep-kubelet" / name
    try:
        cgroup.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return cgroup


def remove_cgroup(cgroup: Path | None) -> None:
    """Stop what is left in a container's cgroup (a process restored into it) and remove it, as a runtime does."""
    if cgroup is None or not cgroup.is_dir():
        return
    deadline = time.monotonic() + 5
    while True:
        try:
            for pid in (cgroup / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            cgroup.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


class ImageError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _fetch(url: str, accept: str, image: str) -> bytes:
    """GET from the registry, as a runtime's pull: a missing or unreachable image is ErrImagePull."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}), timeout=10) as answer:
            return bytes(answer.read())
    except urllib.error.HTTPError as exc:
        raise ImageError("ErrImagePull", f"failed to pull image {image!r}: {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ImageError("ErrImagePull", f"failed to pull image {image!r}: {exc}") from None
