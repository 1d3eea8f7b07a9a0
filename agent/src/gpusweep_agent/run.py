"""`gpusweep-run -- CMD ...`: start a workload under the node agent.

It registers the workload with the local agent under a stable id (``--workload-id``, else
``GPUSWEEP_WORKLOAD_ID``, else ``slurm-<SLURM_JOB_ID>``, which survives a requeue) and then
becomes the command (exec, same pid). When a checkpoint of that workload is pending, the agent
restores it instead: for a process image (criu, cuda) the wrapper waits for the restored process
to end; for the signal engine the command starts with ``GPUSWEEP_RESTORE_DIR`` set; a checkpoint
that is invalid here (different driver ...) means a cold start, which is printed.

The agent is found and authenticated through the same settings as the agent itself
(``GPUSWEEP_AGENT_CONFIG`` or ``GPUSWEEP_AGENT_*``: endpoint, cluster, node, key or key_file).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

from .client import AgentClient, AgentClientError
from .config import ConfigError, load_config
from .util import pid_alive


def workload_id_from_env(env: dict[str, str]) -> str:
    if env.get("GPUSWEEP_WORKLOAD_ID"):
        return env["GPUSWEEP_WORKLOAD_ID"]
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    return f"wl-{uuid.uuid4().hex[:12]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpusweep-run", description="start a workload under the gpusweep agent")
    parser.add_argument("--workload-id")
    parser.add_argument("--name", default="")
    parser.add_argument("--engine", default="criu", help="checkpoint engine: criu, cuda, signal or none")
    parser.add_argument("--signal", default="SIGUSR1", help="the signal the signal engine sends")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: gpusweep-run [options] -- CMD ...")
    env = dict(os.environ)
    workload_id = args.workload_id or workload_id_from_env(env)
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"gpusweep-run: {exc}", file=sys.stderr)
        return 2
    client = AgentClient(config.endpoint, config.identity, config.key)
    try:
        op = client.call(
            "/v1/workloads", operation_id=f"register-{workload_id}-{os.getpid()}-{int(time.time())}",
            workload_id=workload_id, pid=os.getpid(), name=args.name or os.path.basename(command[0]),
            checkpoint_engine=args.engine, checkpoint_signal=args.signal, gpus=args.gpus,
            command=command, cwd=os.getcwd(), env=env,
        )
    except AgentClientError as exc:
        print(f"gpusweep-run: workload {workload_id}: the agent did not answer: {exc}", file=sys.stderr)
        return 75  # EX_TEMPFAIL: a scheduler may retry
    if op["state"] != "succeeded":
        print(f"gpusweep-run: workload {workload_id}: {op.get('error')}", file=sys.stderr)
        return 75
    result = op["result"]
    if result["action"] == "restored":
        pid = int(result["pid"])
        print(f"gpusweep-run: workload {workload_id} restored from {result['checkpoint_id']} as pid {pid}",
              file=sys.stderr, flush=True)
        while pid_alive(pid):
            time.sleep(1)
        return 0
    env["GPUSWEEP_WORKLOAD_ID"] = workload_id
    env["GPUSWEEP_CHECKPOINT_DIR"] = result["checkpoint_dir"]
    env.pop("GPUSWEEP_RESTORE_DIR", None)
    if result["action"] == "resume":
        env["GPUSWEEP_RESTORE_DIR"] = result["restore_dir"]
        print(f"gpusweep-run: workload {workload_id} resumes from {result['checkpoint_id']}", file=sys.stderr,
              flush=True)
    elif result.get("cold_start"):
        why = result.get("message") or "its checkpoint kept no state (engine none)"
        print(f"gpusweep-run: workload {workload_id} COLD START: {why}", file=sys.stderr, flush=True)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"gpusweep-run: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
