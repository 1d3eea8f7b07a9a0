"""Slurm: nodes, GRES, features and running jobs, through the Slurm CLI.

`SlurmClient` is the interface; `CliSlurmClient` implements it with `sinfo --json` and
`squeue --json` (Slurm 22.05+; `scontrol show node -o` has no JSON there), after `scontrol ping`
(a down controller fails fast with Slurm's own words). A pyslurm implementation would return
the same dictionaries: the mapping to the inventory (`snapshot_from_slurm`) only reads the
documented JSON fields.

Conventions (cluster.connection keys, all optional):
- `slurm_conf`: path exported as SLURM_CONF to every command (else the system default);
- `bin_dir`: folder of the Slurm binaries (else PATH);
- `timeout_s`: per-command timeout (else GPUSWEEP_SLURM_TIMEOUT_S, 30 s);
- `component_features`: feature prefix -> component. Default: `nvdriver_` -> driver and
  `cuda_` -> cuda, so a site that publishes `Feature=nvdriver_570.86.15,cuda_12.8` on its
  nodes gets those versions. The GPU model comes from a typed GRES (`gpu:h100:8`) or, when the
  GRES is untyped, from a `gpumodel_<name>` feature.
Each node's kernel is read from slurmd's `operating_system` ("Linux 6.1.0-27-amd64 ...").
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from inventory.choices import ServiceState, WorkloadKind
from inventory.services import ObservedNode, ObservedWorkload, Snapshot

DEFAULT_COMPONENT_FEATURES = {"nvdriver_": "driver", "cuda_": "cuda"}
MODEL_FEATURE = "gpumodel_"
# Job states that hold a node's resources.
ACTIVE_JOB_STATES = {"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED"}
_GRES = re.compile(r"^(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?(?::(?P<count>\d+))?")


class SlurmError(RuntimeError):
    """A Slurm command failed or timed out; the message names the command."""


class SlurmClient(Protocol):
    """What the sync and the Slurm executor need from Slurm. Dictionaries follow `sinfo --json` /
    `squeue --json`; reservations are `scontrol show reservation -o` as {field: value}.

    The writes are the `scontrol` commands an administrator would type; each raises SlurmError
    with Slurm's own words when it is refused."""

    def ping(self) -> None:
        """Raise SlurmError when the controller does not answer."""

    def nodes(self) -> list[dict[str, Any]]: ...

    def jobs(self) -> list[dict[str, Any]]: ...

    def reservations(self) -> list[dict[str, str]]: ...

    def update_node(self, name: str, **fields: str) -> None:
        """`scontrol update nodename=NAME key=value ...` (state=DRAIN reason=..., state=RESUME, features)."""

    def update_job(self, job_id: str, **fields: str) -> None:
        """`scontrol update jobid=ID key=value ...` (nodelist, excnodelist, features, admincomment)."""

    def requeue(self, job_id: str, hold: bool) -> None:
        """`scontrol requeuehold ID` (hold) or `scontrol requeue ID`."""

    def release(self, job_id: str) -> None: ...

    def reboot(self, name: str, reason: str) -> None:
        """`scontrol reboot ASAP nextstate=RESUME reason=... NAME` (the site's RebootProgram reboots)."""

    def create_reservation(self, name: str, nodes: list[str], start: str, minutes: int, flags: str,
                           users: str = "root") -> None: ...

    def update_reservation(self, name: str, nodes: list[str]) -> None:
        """`scontrol update reservationname=NAME nodes=...` (a node leaves a wave's reservation)."""

    def delete_reservation(self, name: str) -> None: ...

    def config(self) -> dict[str, str]:
        """`scontrol show config`: slurm.conf's settings as slurmctld runs them (JobFileAppend ...)."""

    def end_reservation(self, name: str) -> None:
        """`scontrol update reservationname=NAME endtime=now`: Slurm refuses to delete one a running job
        uses; ended, it goes, and the job runs on."""


class CliSlurmClient:
    def __init__(self, connection: dict[str, Any] | None = None) -> None:
        connection = connection or {}
        self.slurm_conf: str = connection.get("slurm_conf", "")
        self.bin_dir: str = connection.get("bin_dir", "")
        self.timeout = float(connection.get("timeout_s", settings.GPUSWEEP_SLURM_TIMEOUT_S))

    def _run(self, *args: str) -> str:
        return self._run_full(*args)[0]

    def _run_full(self, *args: str) -> tuple[str, str]:
        command = " ".join(args)
        executable = str(Path(self.bin_dir) / args[0]) if self.bin_dir else args[0]
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        try:
            done = subprocess.run(
                [executable, *args[1:]], env=env, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`{command}` timed out after {self.timeout:g} s") from None
        except OSError as exc:
            raise SlurmError(f"`{command}` could not start: {exc.strerror}") from None
        if done.returncode != 0:
            # The last line that says something (scontrol frames its news in rows of asterisks).
            detail = [line for line in (done.stderr or done.stdout).strip().splitlines()
                      if line.strip() and not line.lstrip().startswith("**")]
            raise SlurmError(f"`{command}` failed (exit {done.returncode}): {detail[-1] if detail else 'no output'}")
        return done.stdout, done.stderr

    def _json(self, *args: str) -> dict[str, Any]:
        out, err = self._run_full(*args)
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"`{' '.join(args)}` did not print JSON ({exc})") from None
        if not isinstance(data, dict):
            raise SlurmError(f"`{' '.join(args)}` printed JSON that is not an object")
        errors = data.get("errors") or []
        if errors:
            # Slurm 22.05 exits 0 with {"errors": [...]}; the useful text is on stderr.
            lines = err.strip().splitlines()
            detail = lines[-1] if lines else str(errors)
            raise SlurmError(f"`{' '.join(args)}` failed: {detail}")
        return data

    def ping(self) -> None:
        self._run("scontrol", "ping")

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._json("sinfo", "--json").get("nodes", []))

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._json("squeue", "--json").get("jobs", []))

    def reservations(self) -> list[dict[str, str]]:
        # Slurm 22.05 has no JSON for reservations; the one-line form is key=value pairs.
        out = self._run("scontrol", "show", "reservation", "-o")
        return [parse_key_values(line) for line in out.splitlines() if line.startswith("ReservationName=")]

    @staticmethod
    def _pairs(fields: dict[str, str]) -> list[str]:
        return [f"{key}={value}" for key, value in fields.items()]

    def update_node(self, name: str, **fields: str) -> None:
        self._run("scontrol", "update", f"nodename={name}", *self._pairs(fields))

    def update_job(self, job_id: str, **fields: str) -> None:
        self._run("scontrol", "update", f"jobid={job_id}", *self._pairs(fields))

    def requeue(self, job_id: str, hold: bool) -> None:
        self._run("scontrol", "requeuehold" if hold else "requeue", job_id)

    def release(self, job_id: str) -> None:
        self._run("scontrol", "release", job_id)

    def reboot(self, name: str, reason: str) -> None:
        self._run("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", name)

    def create_reservation(self, name: str, nodes: list[str], start: str, minutes: int, flags: str,
                           users: str = "root") -> None:
        self._run("scontrol", "create", "reservation", f"reservationname={name}", f"users={users}",
                  f"nodes={','.join(nodes)}", f"starttime={start}", f"duration={max(1, minutes)}", f"flags={flags}")

    def update_reservation(self, name: str, nodes: list[str]) -> None:
        self._run("scontrol", "update", f"reservationname={name}", f"nodes={','.join(nodes)}")

    def delete_reservation(self, name: str) -> None:
        self._run("scontrol", "delete", f"reservationname={name}")

    def config(self) -> dict[str, str]:
        found = {}
        for line in self._run("scontrol", "show", "config").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                found[key.strip()] = value.strip()
        return found

    def end_reservation(self, name: str) -> None:
        self._run("scontrol", "update", f"reservationname={name}", "endtime=now")


def parse_key_values(line: str) -> dict[str, str]:
    """{'ReservationName': 'r1', 'Nodes': 'gpu[01-02]', ...} from `scontrol show ... -o` (values have no spaces,
    except the last field's, which takes the rest of the line)."""
    found: dict[str, str] = {}
    for match in re.finditer(r"(\w+)=(.*?)(?=\s+\w+=|$)", line.strip()):
        found[match.group(1)] = match.group(2).strip()
    return found


def _number(value: Any) -> int | None:
    """Slurm 22.05 prints plain numbers; 23.x prints {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_gres(gres: str) -> tuple[str, int]:
    """('h100', 8) for 'gpu:h100:8(S:0-1)'; ('', 4) for 'gpu:4'; ('', 0) without GPUs."""
    model, count = "", 0
    for item in (gres or "").split(","):
        match = _GRES.match(item.strip())
        if not match or match.group("name") != "gpu":
            continue
        kind, number = match.group("type"), match.group("count")
        if number is None and kind and kind.isdigit():
            kind, number = None, kind
        count += int(number or 1)
        model = model or (kind or "")
    return model, count


def _state(node: dict[str, Any]) -> tuple[str, str]:
    """(scheduler_state text, service_state) from a sinfo node."""
    raw = node.get("state", "")
    states = [s.lower() for s in (raw if isinstance(raw, list) else [raw])]
    flags = [f.lower() for f in node.get("state_flags", [])]
    text = "+".join([*states, *flags])
    words = set(states) | set(flags)
    if words & {"down", "not_responding", "fail", "failing", "future", "unknown", "invalid", "power_down",
                "powered_down"}:
        service = ServiceState.OFFLINE
    elif words & {"drain", "draining", "drained", "reboot_requested", "reboot_issued", "maintenance"}:
        service = ServiceState.DRAINING
    else:
        service = ServiceState.IN_SERVICE
    return text, service


def node_from_slurm(node: dict[str, Any], component_features: dict[str, str]) -> ObservedNode:
    name = str(node.get("name", ""))
    features = [f for f in str(node.get("active_features") or node.get("features") or "").split(",") if f]
    components: dict[str, str] = {}
    model_feature = ""
    for feature in features:
        for prefix, component in component_features.items():
            if feature.startswith(prefix) and len(feature) > len(prefix):
                components[component] = feature[len(prefix):]
        if feature.startswith(MODEL_FEATURE):
            model_feature = feature[len(MODEL_FEATURE):]
    os_text = str(node.get("operating_system") or "")
    parts = os_text.split()
    if len(parts) >= 2 and parts[0] == "Linux":
        components["kernel"] = parts[1]
    gres_model, gpu_count = parse_gres(str(node.get("gres") or ""))
    scheduler_state, service_state = _state(node)
    partitions = [str(p) for p in node.get("partitions", [])]
    labels = {"slurm.features": ",".join(features), "slurm.partitions": ",".join(partitions)}
    cpus = _number(node.get("cpus"))
    memory = _number(node.get("real_memory"))
    return ObservedNode(
        name=name,
        components=components,
        pool=partitions[0] if partitions else "",
        labels=labels,
        gpu_model=gres_model or model_feature,
        gpu_count=gpu_count,
        cpu_milli=cpus * 1000 if cpus is not None else None,
        memory_mib=memory,
        scheduler_state=scheduler_state[:100],
        service_state=service_state,
        origin=f"sinfo node {name!r}",
    )


def _job_gpus(job: dict[str, Any]) -> int:
    total = 0
    for detail in job.get("gres_detail", []) or []:
        _model, count = parse_gres(str(detail))
        total += count
    if total:
        return total
    per_node = str(job.get("tres_per_node") or "").removeprefix("gres:")
    _model, count = parse_gres(per_node)
    return count * max(_number(job.get("node_count")) or 1, 1)


def _job_node(job: dict[str, Any]) -> str | None:
    host = job.get("batch_host")
    if host:
        return str(host)
    allocated = (job.get("job_resources") or {}).get("allocated_nodes") or []
    if allocated:
        return str(allocated[0].get("nodename"))
    return None


def expand_hostlist(text: str) -> list[str]:
    """'gpu[01-03,05],cpu1' -> ['gpu01', 'gpu02', 'gpu03', 'gpu05', 'cpu1'] (Slurm hostlist syntax)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text or ""):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                names.append(prefix + low)
                continue
            width = len(low)
            names.extend(f"{prefix}{number:0{width}d}" for number in range(int(low), int(high) + 1))
    return names


def _job_nodes(job: dict[str, Any]) -> list[str]:
    allocated = (job.get("job_resources") or {}).get("allocated_nodes") or []
    names = [str(item.get("nodename")) for item in allocated if item.get("nodename")]
    return names or expand_hostlist(str(job.get("nodes") or ""))


def workload_from_slurm(job: dict[str, Any]) -> ObservedWorkload | None:
    state = job.get("job_state", "")
    state = state[0] if isinstance(state, list) and state else state
    if str(state).upper() not in ACTIVE_JOB_STATES:
        return None
    start = _number(job.get("start_time"))
    limit = _number(job.get("time_limit"))  # minutes
    return ObservedWorkload(
        kind=WorkloadKind.SLURM_JOB,
        scheduler_id=str(job.get("job_id")),
        node=_job_node(job),
        nodes=_job_nodes(job),
        name=str(job.get("name") or "")[:200],
        user=str(job.get("user_name") or job.get("user_id") or "")[:100],
        state=str(state).lower(),
        gpus=_job_gpus(job),
        started_at=dt.datetime.fromtimestamp(start, tz=dt.UTC) if start else None,
        time_limit=dt.timedelta(minutes=limit) if limit else None,
    )


def snapshot_from_slurm(client: SlurmClient, connection: dict[str, Any] | None = None) -> Snapshot:
    """The whole cluster as Slurm sees it: every node, and every job holding a node."""
    component_features = dict((connection or {}).get("component_features") or DEFAULT_COMPONENT_FEATURES)
    client.ping()  # a down controller fails fast and says so, instead of sinfo's retries
    nodes = [node_from_slurm(node, component_features) for node in client.nodes()]
    workloads = [w for w in (workload_from_slurm(job) for job in client.jobs()) if w is not None]
    return Snapshot(
        nodes=nodes,
        workloads=workloads,
        complete=True,
        replace_components=False,  # Slurm knows a few components; the agent reports the rest
        workload_kinds=frozenset({WorkloadKind.SLURM_JOB}),
    )
