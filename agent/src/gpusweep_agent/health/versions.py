"""The expected versions: every component the service patched reports the version it asked for."""

from __future__ import annotations

from typing import Any

from .base import FAILED, PASSED, SKIPPED, CheckResult, HealthCheck, HealthRequest


class VersionsCheck(HealthCheck):
    name = "versions"

    def run(self, request: HealthRequest, facts: dict[str, Any]) -> list[CheckResult]:
        if not request.expected:
            return [CheckResult(self.name, SKIPPED, "no expected versions were sent")]
        have = facts.get("components") or {}
        wrong = {c: {"want": v, "got": have.get(c, "")} for c, v in sorted(request.expected.items())
                 if have.get(c) != v}
        lines = [f"{c}: want {v}, have {have.get(c, '(absent)')}" for c, v in sorted(request.expected.items())]
        if wrong:
            return [CheckResult(self.name, FAILED, f"{len(wrong)} component(s) not at the expected version",
                                "\n".join(lines), {"wrong": wrong})]
        return [CheckResult(self.name, PASSED, "every component at the expected version", "\n".join(lines))]
