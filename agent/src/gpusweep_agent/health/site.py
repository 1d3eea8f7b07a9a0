"""The site's own checks: configured commands (Node Health Check's `nhc`, or any script).

``health_options.site``: ``{"commands": {"nhc": "/usr/sbin/nhc -t 300", "ib": "/opt/site/check-ib"},
"timeout": 600}``. Each command runs as configured (split into words, no shell); exit code 0
passes, anything else fails, and its output is kept. A campaign names the ones it wants (none
named: every configured one); one it names that this node does not have fails the gate, since a
check that cannot run has not passed. The service sends names only, never a command.
"""

from __future__ import annotations

import shlex
from typing import Any

from .base import FAILED, PASSED, SKIPPED, CheckResult, HealthCheck, HealthRequest, run_command


class SiteCheck(HealthCheck):
    name = "site"

    def run(self, request: HealthRequest, facts: dict[str, Any]) -> list[CheckResult]:
        commands = {str(k): str(v) for k, v in dict(self.options.get("commands") or {}).items()}
        wanted = sorted(commands) if request.site_checks is None else list(request.site_checks)
        if not wanted:
            return [CheckResult(self.name, SKIPPED, "no site checks are configured on this node")]
        timeout = float(self.options.get("timeout", 600))
        results = []
        for name in wanted:
            label = f"site:{name}"
            if name not in commands:
                results.append(CheckResult(label, FAILED, f"site check {name!r} is not configured on this node "
                                           f"(configured: {', '.join(sorted(commands)) or 'none'})"))
                continue
            argv = shlex.split(commands[name])
            code, output = run_command(argv, timeout)
            last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
            status = PASSED if code == 0 else FAILED
            summary = f"{shlex.join(argv)} exited {code if code is not None else '(did not run)'}" + (
                f": {last[:300]}" if last else "")
            results.append(CheckResult(label, status, summary, output, {"exit_code": code, "command": argv}))
        return results
