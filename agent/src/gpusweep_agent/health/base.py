"""The health gate's building blocks: one check, its result, and what the service asks for.

A check is a class with a ``name`` and ``run(request, facts) -> CheckResult``; the registry in
``health/__init__.py`` names the built-in ones and a dotted path adds a site's own (as probes
and checkpoint engines do). A check whose source is absent on this node (no DCGM, no nvidia-smi)
answers ``skipped`` with the reason, never ``passed``: the evidence says what was not checked.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import AgentConfig

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
OUTPUT_LIMIT = 20_000


@dataclass(frozen=True)
class HealthRequest:
    """What the service asks the node to prove before it returns to service."""

    expected: dict[str, str] = field(default_factory=dict)  # component -> version
    gpu_count: int = 0  # GPUs the inventory knows; 0: the count the node's facts report
    dcgm_level: int = 0  # 0: no DCGM diagnostics; 1-4: `dcgmi diag -r LEVEL`
    site_checks: list[str] | None = None  # names of configured site checks; None: all of them


@dataclass
class CheckResult:
    name: str
    status: str
    summary: str = ""
    output: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["output"] = data["output"][-OUTPUT_LIMIT:]
        return data


class HealthCheck:
    name = ""

    def __init__(self, config: AgentConfig, options: dict[str, Any]) -> None:
        self.config = config
        self.options = options

    def run(self, request: HealthRequest, facts: dict[str, Any]) -> list[CheckResult]:
        """One or more results (the site check answers once per configured command)."""
        raise NotImplementedError


def run_command(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit code, stdout+stderr); None as the code when it could not run or timed out."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        return None, f"{shlex.join(argv)}: {exc}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{shlex.join(argv)}: {exc}"
    return proc.returncode, (proc.stdout + (("\n" + proc.stderr) if proc.stderr else ""))[-OUTPUT_LIMIT:]
