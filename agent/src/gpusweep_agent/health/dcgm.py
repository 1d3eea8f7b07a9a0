"""DCGM diagnostics: `dcgmi diag -r LEVEL -j`, the level chosen per campaign (0: none).

The JSON is parsed as DCGM documents it: DCGM 3 answers under "DCGM GPU Diagnostic", DCGM 4 under
"DCGM Diagnostic"; both hold ``test_categories[].tests[].results[]`` with a ``status`` of Pass,
Fail, Warn or Skip (and ``warnings[].warning`` texts). Any Fail fails the check; Warn is reported
and passes. Tested here only on recorded samples written in those formats (agent/tests/data),
not on a GPU. Options (``health_options.dcgm``): ``dcgmi`` (``dcgmi``), ``timeout`` (3600 s).
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from .base import FAILED, PASSED, SKIPPED, CheckResult, HealthCheck, HealthRequest, run_command

ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")


class DcgmParseError(Exception):
    """The output is not DCGM's diagnostic JSON."""


def _target(result: dict[str, Any]) -> str:
    if "gpu_ids" in result or "gpu_id" in result:
        return f"GPU {result.get('gpu_ids', result.get('gpu_id'))}"
    if "entity_id" in result:
        return f"{result.get('entity_group', 'GPU')} {result['entity_id']}"
    return "node"


def parse_diag(text: str) -> dict[str, Any]:
    """{"tests": [{"category", "test", "target", "status", "warnings"}], "failed": [...], "warned": [...]}."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DcgmParseError(f"not JSON: {exc}") from None
    root = next((data[k] for k in ROOTS if isinstance(data, dict) and k in data), None)
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        raise DcgmParseError(f"no {' or '.join(repr(r) for r in ROOTS)} with test_categories")
    tests: list[dict[str, Any]] = []
    for category in root["test_categories"]:
        for test in category.get("tests") or []:
            for result in test.get("results") or []:
                warnings = [str(w.get("warning", w)) if isinstance(w, dict) else str(w)
                            for w in result.get("warnings") or []]
                tests.append({"category": str(category.get("category", "")), "test": str(test.get("name", "")),
                              "target": _target(result), "status": str(result.get("status", "")),
                              "warnings": warnings})
    failed = [t for t in tests if str(t["status"]).lower() == "fail"]
    warned = [t for t in tests if str(t["status"]).lower() == "warn"]
    return {"tests": tests, "failed": failed, "warned": warned, "version": str(data.get("version", ""))}


class DcgmCheck(HealthCheck):
    name = "dcgm"

    def run(self, request: HealthRequest, facts: dict[str, Any]) -> list[CheckResult]:
        if not request.dcgm_level:
            return [CheckResult(self.name, SKIPPED, "the campaign asks for no DCGM diagnostics (level 0)")]
        dcgmi = shutil.which(str(self.options.get("dcgmi", "dcgmi")))
        if not dcgmi:
            return [CheckResult(self.name, SKIPPED, "DCGM (dcgmi) is not installed on this node")]
        argv = [dcgmi, "diag", "-r", str(request.dcgm_level), "-j"]
        code, output = run_command(argv, float(self.options.get("timeout", 3600)))
        try:
            parsed = parse_diag(output)
        except DcgmParseError as exc:
            return [CheckResult(self.name, FAILED, f"dcgmi diag -r {request.dcgm_level} exited {code}: {exc}",
                                output)]
        detail = {"level": request.dcgm_level, "exit_code": code, **parsed}
        if parsed["failed"]:
            names = ", ".join(f"{t['test']} on {t['target']}" for t in parsed["failed"])
            first = next((w for t in parsed["failed"] for w in t["warnings"]), "")
            return [CheckResult(self.name, FAILED, f"level {request.dcgm_level}: failed {names}"
                                + (f": {first}" if first else ""), output, detail)]
        warned = f", {len(parsed['warned'])} warning(s)" if parsed["warned"] else ""
        return [CheckResult(self.name, PASSED, f"level {request.dcgm_level}: {len(parsed['tests'])} results pass"
                            + warned, output, detail)]
