"""Health gates: the checks a node passes after its reboot and before it returns to service.

Each check is one module here plus its entry in ``HEALTH_CHECKS``; the agent's ``health_checks``
setting lists the ones to run (a dotted path adds a site's own ``HealthCheck`` class) and
``health_options`` holds each one's options. ``run_checks`` runs them in order and keeps every
result with its output: the service records them all in the campaign's evidence.
"""

from __future__ import annotations

from typing import Any

from ..config import AgentConfig
from ..util import import_string
from .base import FAILED, PASSED, SKIPPED, CheckResult, HealthCheck, HealthRequest

HEALTH_CHECKS = {
    "versions": "gpusweep_agent.health.versions.VersionsCheck",
    "gpus": "gpusweep_agent.health.gpus.GpusCheck",
    "dcgm": "gpusweep_agent.health.dcgm.DcgmCheck",
    "site": "gpusweep_agent.health.site.SiteCheck",
}
DEFAULT_CHECKS = ["versions", "gpus", "dcgm", "site"]

__all__ = ["DEFAULT_CHECKS", "FAILED", "HEALTH_CHECKS", "PASSED", "SKIPPED", "CheckResult", "HealthCheck",
           "HealthRequest", "load_check", "run_checks"]


class HealthConfigError(Exception):
    """A configured check cannot be loaded."""


def load_check(name: str, config: AgentConfig) -> HealthCheck:
    dotted = HEALTH_CHECKS.get(name, name)
    try:
        cls = import_string(dotted)
    except ImportError as exc:
        raise HealthConfigError(f"health check {name!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, HealthCheck)):
        raise HealthConfigError(f"health check {name!r}: {dotted} is not a HealthCheck")
    short = getattr(cls, "name", "") or name
    return cls(config, dict(config.health_options.get(short) or config.health_options.get(name) or {}))


def run_checks(config: AgentConfig, request: HealthRequest, facts: dict[str, Any]) -> dict[str, Any]:
    """{"passed": bool, "checks": [result...], "failed": [names]}; a check that crashes fails."""
    results: list[CheckResult] = []
    for name in config.health_checks:
        try:
            results.extend(load_check(name, config).run(request, facts))
        except Exception as exc:  # noqa: BLE001 - a broken check must fail the gate, not the agent
            results.append(CheckResult(name, FAILED, f"the check itself failed: {type(exc).__name__}: {exc}"))
    failed = [r.name for r in results if r.status == FAILED]
    return {"passed": not failed, "failed": failed, "checks": [r.as_dict() for r in results]}
