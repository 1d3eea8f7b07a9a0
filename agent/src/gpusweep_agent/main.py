"""`gpusweep-agent`: serve the /v1 API, send heartbeats, and recover unfinished operations."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from types import FrameType

from .agent import Agent
from .config import ConfigError, add_arguments, load_config
from .heartbeat import HeartbeatSender
from .osinfo import OsProbe
from .server import AgentServer, UnixAgentServer

log = logging.getLogger("gpusweep_agent")


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="gpusweep-agent", description=__doc__)
    add_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(args_list)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args)
    except ConfigError as exc:
        print(f"gpusweep-agent: {exc}", file=sys.stderr)
        return 2

    agent = Agent(config, args_list)
    agent.recover()
    threading.Thread(target=agent.reaper, name="reaper", daemon=True).start()
    try:
        server = AgentServer((config.listen, config.port), agent)
    except OSError as exc:
        print(f"gpusweep-agent: cannot listen on {config.listen}:{config.port}: {exc}", file=sys.stderr)
        return 1
    unix_server = None
    if config.socket:
        try:
            unix_server = UnixAgentServer(config.socket, agent)
        except OSError as exc:
            print(f"gpusweep-agent: cannot listen on {config.socket}: {exc}", file=sys.stderr)
            return 1
        threading.Thread(target=unix_server.serve_forever, name="unix", daemon=True).start()
    heartbeat = None
    if config.service_url:
        heartbeat = HeartbeatSender(
            config.service_url, config.cluster, config.node, config.key, config.endpoint,
            facts=agent.facts, workloads=agent.list_workloads,
            interval=config.heartbeat_interval, max_backoff=config.heartbeat_max_backoff,
            os_report=OsProbe.of(config).report if config.report_os else None,
        )
        threading.Thread(target=heartbeat.run, name="heartbeat", daemon=True).start()
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("gpusweep-agent %s serving %s on %s:%s", config.identity, config.state_dir, config.listen, config.port)

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stopping.is_set() and not agent.restart_requested.is_set():
        stopping.wait(0.2)
    if agent.restart_requested.is_set():
        time.sleep(0.5)  # let the answer to the reboot call reach its caller before the restart
    for running in (server, unix_server):
        if running is not None:
            running.shutdown()
            running.server_close()
    agent.stop()
    if heartbeat:
        heartbeat.stop()
    if agent.restart_requested.is_set() and not stopping.is_set():
        agent.reexec()
    return 0


if __name__ == "__main__":
    sys.exit(main())
