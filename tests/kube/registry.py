"""A real OCI registry for the kubelet checkpoint path: Debian's ``docker-registry`` (CNCF distribution 2.8),
run as a process of the test's own on a free localhost port, storing in the test's folder (plain HTTP)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from conftest import need
from tests.helpers import free_port, stop_process_group, wait_for

HINT = "needs the docker-registry package: apt-get install docker-registry (scripts/install-system-deps.sh)"


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/v2/", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def docker_registry(root: Path) -> Iterator[str]:
    """A running registry's address (``127.0.0.1:<port>``), stopped afterwards."""
    binary = shutil.which("docker-registry") or shutil.which("registry")
    need(binary is not None, HINT)
    assert binary is not None
    address = f"127.0.0.1:{free_port()}"
    root.mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
                      f"    rootdirectory: {root / 'data'}\nhttp:\n  addr: {address}\n")
    log = root / "registry.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if not wait_for(lambda: proc.poll() is None and _answers(address), 20, 0.1):
            raise AssertionError(f"docker-registry did not answer on {address}: {log.read_text()[-2000:]}")
        yield address
    finally:
        stop_process_group(proc, 10)
