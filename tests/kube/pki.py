"""A CA and a server certificate for 127.0.0.1, made once per test session with the openssl command."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from conftest import need


@cache
def server_pki() -> dict[str, Path]:
    """ca.pem, server.pem, server.key in a folder that lives as long as the test session."""
    need(shutil.which("openssl") is not None, "needs the openssl command (apt-get install openssl)")
    folder = Path(tempfile.mkdtemp(prefix="gpusweep-kube-pki-"))

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=gpusweep test kubernetes CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=kube-apiserver")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
                                       "extendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "server.ext")
    return {name: folder / name for name in ("ca.pem", "server.pem", "server.key")}
