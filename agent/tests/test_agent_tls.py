"""Optional mutual TLS on the agent's API, with certificates made by the openssl command."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from agent_helpers import AgentProcess
from gpusweep_agent.client import AgentClient, AgentClientError

from conftest import need


def make_pki(folder: Path) -> dict[str, Path]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=gpusweep test CA")
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        (folder / f"{name}.ext").write_text(extra + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {n: folder / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def test_it_requires_a_client_certificate_when_mutual_tls_is_on(tmp_path: Path) -> None:
    need(shutil.which("openssl") is not None, "needs the openssl command (apt-get install openssl)")
    pki = make_pki(tmp_path)
    agent = AgentProcess(tmp_path, "gpu-tls", tmp_path / "artifacts", tls_cert=str(pki["server.pem"]),
                         tls_key=str(pki["server.key"]), tls_client_ca=str(pki["ca.pem"]))
    agent.client = AgentClient(f"https://127.0.0.1:{agent.port}", agent.client.identity, agent.key,
                               ssl_context=ssl.create_default_context(cafile=str(pki["ca.pem"])))
    # Health checks during start-up need the client certificate too.
    agent.client.ssl_context.load_cert_chain(str(pki["client.pem"]), str(pki["client.key"]))
    agent.start()
    try:
        assert agent.client.get("/v1/health")["status"] == "ok"
        without_cert = AgentClient(agent.client.endpoint, agent.client.identity, agent.key,
                                   ssl_context=ssl.create_default_context(cafile=str(pki["ca.pem"])))
        with pytest.raises(AgentClientError):
            without_cert.get("/v1/health")
        plain = AgentClient(f"http://127.0.0.1:{agent.port}", agent.client.identity, agent.key, timeout=5)
        with pytest.raises(AgentClientError):
            plain.get("/v1/health")
        # TLS does not replace the signature: a certified caller without the node key is still refused.
        unsigned = agent.client.request("GET", "/v1/health", signed=False)
        assert unsigned[0] == 401
        assert agent.client.get("/v1/health")["status"] == "ok", "the agent still serves after refused handshakes"
    finally:
        agent.stop()
