"""`gpusweep-run -- CMD ...`: start a workload under the node agent.

It registers the workload with the local agent under a stable id (``--workload-id``, else
``GPUSWEEP_WORKLOAD_ID``, else ``slurm-<SLURM_JOB_ID>``, which survives a requeue) and then
becomes the command (exec, same pid). When a checkpoint of that workload is pending, the agent
restores it instead: for a process image (criu, cuda) the wrapper waits for the restored process
to end; for the signal engine the command starts with ``GPUSWEEP_RESTORE_DIR`` set; a checkpoint
that is invalid here (different driver ...) means a cold start, which is printed.

With ``--pid-namespace`` the command runs as pid 1 of its own pid namespace (the wrapper stays
as its parent and exits with its status). CRIU then restores the namespace under a new host pid,
so a restore never collides with a pid in use on the target (including the original's, when it
was checkpointed with leave_running).

Under Slurm (``SLURM_JOB_ID`` set) the wrapper always stays as the payload's parent and runs it in
a session of its own, so the payload can be checkpointed with no extra flag (CRIU needs the tree
to lead its own session). A criu checkpoint is restored by the wrapper itself, inside the
requeued job (it runs the agent's ``criu restore`` command as a child subreaper, so the restored
process becomes its child: ``scancel``, ``sstat`` and the time limit reach it), then reports the
restored pid to the agent. With ``--pid-namespace`` the agent restores instead (a fresh host pid,
but outside the job).
When the agent checkpoints the payload, the wrapper keeps the job alive until gpusweep requeues
it (``scontrol requeuehold``; at most ``GPUSWEEP_REQUEUE_WAIT_S``, 3600 s), so the job is
requeued rather than ended; the requeued job's ``gpusweep-run`` restores the checkpoint.
``--no-pid-namespace`` keeps the plain exec.

The job's output survives the requeue. Slurm 22.05 reopens a requeued job's output files truncated
unless the job was submitted with ``--open-mode=append`` (the job then has ``SLURM_OPEN_MODE=a``) or
the site sets ``JobFileAppend=1`` (the default is 0); the descriptors look alike either way (always
``O_APPEND``), and ``squeue``/``scontrol show job`` do not show the mode. So the wrapper registers
what it knows (``output``: ``append`` for ``SLURM_OPEN_MODE=a``, ``truncate`` for ``t``, ``site`` for
the site's setting, which the executor reads from ``scontrol show config``; ``""``: no output file),
and unless the job appends it copies each output file to ``<file>.gpusweep-keep-<jobid>`` once the
payload is checkpointed; the requeued job's wrapper puts that copy back in front of what the new
run printed (unless the file still begins with it: the site appended) and the job's writes go on
at the end.

``gpusweep-run --hold`` is a replacement pod's placeholder (the Kubernetes executor sets it as the command of
the container a criu or cuda checkpoint is restored into): the container's pid 1 waits for the agent to
restore the workload into the container and ends when it ends (``hold_restored``).

The agent is found and authenticated through the same settings as the agent itself
(``GPUSWEEP_AGENT_CONFIG`` or ``GPUSWEEP_AGENT_*``: endpoint, cluster, node, key or key_file).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .client import AgentClient, AgentClientError
from .config import ConfigError, load_config
from .util import pid_alive

KEEP_SUFFIX = ".gpusweep-keep-"


def output_files(fds: tuple[int, ...] = (1, 2)) -> dict[int, Path]:
    """fd -> the regular file it writes (the job's output files)."""
    found = {}
    for fd in fds:
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
        if path.is_file():
            found[fd] = path
    return found


def output_mode(env: dict[str, str]) -> str:
    """What a requeue does to the job's output files: "append", "truncate", "site" (JobFileAppend decides),
    "" (no output file)."""
    if not output_files():
        return ""
    return {"a": "append", "t": "truncate"}.get(env.get("SLURM_OPEN_MODE", ""), "site")


def keep_output(job_id: str, env: dict[str, str]) -> None:
    """The payload is checkpointed and the job is about to be requeued: copy each output file Slurm may
    truncate, so the requeued job can put it back."""
    if output_mode(env) == "append":
        return
    for path in set(output_files().values()):
        try:
            shutil.copyfile(path, f"{path}{KEEP_SUFFIX}{job_id}")
        except OSError as exc:
            print(f"gpusweep-run: could not keep the output of {path}: {exc}", file=sys.stderr, flush=True)


def restore_output(job_id: str) -> int:
    """In a requeued job: what was printed before the requeue back in front of what this run printed, and
    the job's descriptors at the end of it. Returns the bytes put back."""
    files = output_files()
    kept = 0
    for path in set(files.values()):
        saved = Path(f"{path}{KEEP_SUFFIX}{job_id}")
        if not saved.is_file():
            continue
        before = saved.read_bytes()
        now = path.read_bytes()
        saved.unlink()
        if now.startswith(before):
            continue  # appended after all (the site's JobFileAppend=1): nothing was lost
        with open(path, "r+b") as fh:
            fh.write(before + now)
        for fd, other in files.items():
            if other == path:
                os.lseek(fd, len(before) + len(now), os.SEEK_SET)  # shared with the job's shell and the payload
        kept += len(before)
    return kept


def workload_id_from_env(env: dict[str, str]) -> str:
    if env.get("GPUSWEEP_WORKLOAD_ID"):
        return env["GPUSWEEP_WORKLOAD_ID"]
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}"
    return f"wl-{uuid.uuid4().hex[:12]}"


CLONE_NEWPID = 0x20000000
PR_SET_CHILD_SUBREAPER = 36


class NamespacedChild:
    """A child forked into a new pid namespace (or only a new session, `new_namespace=False`) that
    waits for its command (or to be told to quit)."""

    def __init__(self, new_namespace: bool = True) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if new_namespace and libc.unshare(CLONE_NEWPID) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"unshare(CLONE_NEWPID): {os.strerror(errno)} (needs root)")
        read_end, self._write_end = os.pipe()
        self._open = True
        self.pid = os.fork()
        if self.pid == 0:  # pid 1 of the new namespace
            os.close(self._write_end)
            chunks = []
            while chunk := os.read(read_end, 65536):
                chunks.append(chunk)
            if not chunks:
                os._exit(0)
            message = json.loads(b"".join(chunks))
            os.setsid()
            try:
                os.execvpe(message["command"][0], message["command"], message["env"])
            except OSError as exc:
                os.write(2, f"gpusweep-run: cannot run {message['command'][0]}: {exc}\n".encode())
            os._exit(127)
        os.close(read_end)

    def run(self, command: list[str], env: dict[str, str]) -> int:
        os.write(self._write_end, json.dumps({"command": command, "env": env}).encode())
        os.close(self._write_end)
        self._open = False
        # Stay silent from here: a checkpoint may be taken, and the output files must not grow after it.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._forward)
        _, status = os.waitpid(self.pid, 0)
        self.code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        self.ended = True
        return self.code

    ended = False
    signalled = False  # told to stop (scancel, the time limit): the payload's end is no checkpoint
    # Run when the job ends after its payload was stopped by a signal (a checkpoint): keep_output. The
    # requeue may end the job before the wrapper has asked the agent whether it was a checkpoint.
    on_requeue: Any = None
    code = 0

    def _forward(self, signum: int, frame: Any) -> None:
        if self.ended:  # the payload is gone (checkpointed): the job's end is ours alone
            if self.on_requeue is not None and self.code >= 128:
                self.on_requeue()
            os._exit(128 + signum)
        self.signalled = True
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        """The command will not run: the waiting child reads end-of-file and exits."""
        if self._open:
            self._open = False
            os.close(self._write_end)
            os.waitpid(self.pid, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpusweep-run", description="start a workload under the gpusweep agent")
    parser.add_argument("--workload-id")
    parser.add_argument("--name", default="")
    parser.add_argument("--engine", default="criu", help="checkpoint engine: criu, cuda, signal or none")
    parser.add_argument("--signal", default="SIGUSR1", help="the signal the signal engine sends")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--pid-namespace", action="store_true",
                        help="run the command as pid 1 of a new pid namespace (restores never collide)")
    parser.add_argument("--no-pid-namespace", action="store_true",
                        help="under Slurm: exec the command instead of staying as its parent")
    parser.add_argument("--hold", action="store_true",
                        help="a replacement container's placeholder: wait for the agent to restore the workload "
                             "into this container (at most GPUSWEEP_HOLD_WAIT_S, 3600 s) and end with it")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.hold:
        return hold_restored(float(os.environ.get("GPUSWEEP_HOLD_WAIT_S") or 3600))
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
    child: NamespacedChild | None = None
    under_slurm = bool(env.get("SLURM_JOB_ID")) and not args.no_pid_namespace
    if args.pid_namespace or under_slurm:
        try:
            child = NamespacedChild(new_namespace=args.pid_namespace)
        except OSError as exc:
            print(f"gpusweep-run: {exc}", file=sys.stderr)
            return 2
    try:
        code = launch(args, command, env, workload_id, config.endpoint, config.identity, config.key, child)
    except BaseException:
        if child is not None:
            child.cancel()
        raise
    return code


def launch(args: argparse.Namespace, command: list[str], env: dict[str, str], workload_id: str, endpoint: str,
           identity: str, key: str, child: NamespacedChild | None) -> int:
    client = AgentClient(endpoint, identity, key)
    job_id = env.get("SLURM_JOB_ID", "")
    if job_id:
        kept = restore_output(job_id)
        if kept:
            print(f"gpusweep-run: kept the {kept} bytes job {job_id} printed before its requeue (Slurm truncates "
                  "a requeued job's output unless it runs with --open-mode=append or JobFileAppend=1)",
                  file=sys.stderr, flush=True)
    fields: dict[str, Any] = {
        "workload_id": workload_id, "pid": child.pid if child else os.getpid(),
        "name": args.name or os.path.basename(command[0]), "checkpoint_engine": args.engine,
        "checkpoint_signal": args.signal, "gpus": args.gpus, "command": command, "cwd": os.getcwd(), "env": env,
        # Inside a scheduler's job a criu image is restored by this wrapper, so it stays in the job.
        "restore_in_job": bool(env.get("SLURM_JOB_ID")) and not args.pid_namespace,
        "output": output_mode(env) if job_id else "",
    }
    try:
        op = client.call("/v1/workloads", operation_id=f"register-{workload_id}-{os.getpid()}-{int(time.time())}",
                         **fields)
    except AgentClientError as exc:
        print(f"gpusweep-run: workload {workload_id}: the agent did not answer: {exc}", file=sys.stderr)
        if child:
            child.cancel()
        return 75  # EX_TEMPFAIL: a scheduler may retry
    if op["state"] != "succeeded":
        print(f"gpusweep-run: workload {workload_id}: {op.get('error')}", file=sys.stderr)
        if child:
            child.cancel()
        return 75
    result = op["result"]
    if result["action"] == "restore_in_job":
        if child:
            child.cancel()
        return restore_in_job(client, result, workload_id, env)
    if result["action"] == "restored":
        if child:
            child.cancel()
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
    if child:
        if job_id:
            child.on_requeue = lambda: keep_output(job_id, env)
        code = child.run(command, env)
        # A checkpoint stops the payload with a signal; any other end is the job's own.
        if env.get("SLURM_JOB_ID") and code >= 128 and not child.signalled and _checkpointed(client, workload_id):
            keep_output(env["SLURM_JOB_ID"], env)
            # Keep the job until gpusweep requeues it; silent, so no output file grows after the checkpoint.
            time.sleep(float(env.get("GPUSWEEP_REQUEUE_WAIT_S") or 3600))
        return code
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"gpusweep-run: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


def restore_in_job(client: AgentClient, result: dict[str, Any], workload_id: str, env: dict[str, str]) -> int:
    """Run the agent's `criu restore` here; the restored process is reparented to this wrapper."""
    checkpoint_id = str(result["checkpoint_id"])
    become_subreaper()
    done = subprocess.run(list(result["command"]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, check=False, timeout=600)
    pidfile = Path(str(result["pidfile"]))
    tag = f"{workload_id}-{os.getpid()}-{int(time.time())}"
    if done.returncode != 0 or not pidfile.is_file():
        client.call("/v1/workloads", operation_id=f"restore-failed-{tag}", workload_id=workload_id,
                    pid=os.getpid(), restored_from=checkpoint_id, failed=True)
        print(f"gpusweep-run: workload {workload_id}: criu restore of {checkpoint_id} failed (exit "
              f"{done.returncode}); see the agent's logs", file=sys.stderr, flush=True)
        return 75
    pid = int(pidfile.read_text().strip())
    op = client.call("/v1/workloads", operation_id=f"adopt-{tag}", workload_id=workload_id, pid=pid,
                     restored_from=checkpoint_id)
    if op["state"] != "succeeded":
        print(f"gpusweep-run: workload {workload_id}: {op.get('error')}", file=sys.stderr, flush=True)
    print(f"gpusweep-run: workload {workload_id} restored from {checkpoint_id} in this job as pid {pid}",
          file=sys.stderr, flush=True)
    job_id = env.get("SLURM_JOB_ID", "")
    keep = (lambda: keep_output(job_id, env)) if job_id else None
    signal.signal(signal.SIGTERM, lambda signum, frame: _kill(pid, keep))
    code = _wait_child(pid)
    if code >= 128 and _checkpointed(client, workload_id):
        if env.get("SLURM_JOB_ID"):
            keep_output(env["SLURM_JOB_ID"], env)
        time.sleep(float(env.get("GPUSWEEP_REQUEUE_WAIT_S") or 3600))
    return code


def hold_restored(wait_s: float = 3600.0) -> int:
    """The replacement container's pid 1 while the agent restores the workload into the container: it
    waits (at most `wait_s`) for the restored tree to appear in the container's PID namespace, stays while
    any of it lives, and exits once none is left, so the container ends when its workload ends (and, being
    the namespace's init, takes the workload with it when the runtime stops the container). CRIU's restored
    tree is reparented to the agent (CRIU is the agent's child), not to this process, so it is watched,
    not waited for; children of its own are reaped. Returns the last reaped child's status, else 0."""
    become_subreaper()
    deadline = time.monotonic() + wait_s
    seen, code = False, 0
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if pid:
            code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
            continue
        if _others_in_namespace():
            seen = True
        elif seen:
            return code
        elif time.monotonic() > deadline:
            return 75
        time.sleep(0.2)


def _others_in_namespace(highest: int = 32768) -> bool:
    """Whether any process but this one lives in this PID namespace: /proc when it is this namespace's,
    else a probe of each pid (a container without /proc)."""
    me = os.getpid()
    if os.path.exists(f"/proc/{me}") and os.path.samefile("/proc/self", f"/proc/{me}"):
        return any(entry.isdigit() and int(entry) != me for entry in os.listdir("/proc"))
    for pid in range(1, highest):
        if pid == me:
            continue
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
    return False


def _kill(pid: int, on_requeue: Any = None) -> None:
    """The job is ending: the restored payload goes with it; if it was gone already (checkpointed), this is
    the requeue, and `on_requeue` keeps the job's output."""
    if not pid_alive(pid) and on_requeue is not None:
        on_requeue()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(128 + signal.SIGTERM)


def _wait_child(pid: int) -> int:
    """The exit status of `pid`, our child once CRIU has exited (we are its subreaper)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # not reparented to us (no subreaper): wait by polling
        while pid_alive(pid):
            time.sleep(0.5)
        return 0
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def become_subreaper() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _checkpointed(client: AgentClient, workload_id: str, wait_s: float = 30.0) -> bool:
    """Whether the agent stopped the payload for a checkpoint: it records that just after the stop
    (once the images are sealed), so a payload killed by a signal waits a little for the record."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            listed = client.get("/v1/workloads").get("workloads", [])
        except (AgentClientError, OSError, AttributeError):
            return False
        if any(w.get("id") == workload_id and w.get("state") == "checkpointed" for w in listed):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
