"""The JSON Schema (draft 2020-12) of each event's generic body, and the hook that puts them in OpenAPI.

A receiver validates what it gets against `BODY[kind]`; the OpenAPI document carries them as
components `Webhook<Event>` (spectacular's postprocessing hook `add_to_openapi`), with
`nullable` for OpenAPI 3.0.
"""

from __future__ import annotations

import copy
from typing import Any

from webhooks.choices import EventType
from webhooks.wire import RFC3339_Z

DATE_TIME = {"type": "string", "format": "date-time", "pattern": RFC3339_Z}
URL = {"type": "string", "format": "uri", "pattern": "^https?://"}
ADVISORY = {"type": "string", "pattern": "^[a-z0-9]+-[a-z0-9._-]+$",
            "description": "public advisory id, e.g. nvidia-5703"}
TEXT = {"type": "string"}
COUNT = {"type": "integer", "minimum": 0}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


def _object(properties: dict[str, Any], *, extra: bool = False) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": extra}


EVIDENCE = _object({"kind": TEXT, "seq": COUNT, "hash": TEXT, "actor": TEXT, "at": DATE_TIME,
                    "data": {"type": "object"}})
CAMPAIGN = {
    "campaign": COUNT, "name": TEXT, "advisories": {"type": "array", "items": ADVISORY}, "requested_by": TEXT,
    "approvals_required": COUNT, "plan_version": _nullable(COUNT), "nodes": _nullable(COUNT),
    "expected_start": _nullable(DATE_TIME), "expected_end": _nullable(DATE_TIME), "deadline": _nullable(DATE_TIME),
    "started_at": _nullable(DATE_TIME), "finished_at": _nullable(DATE_TIME), "url": URL, "state": TEXT,
    "evidence": EVIDENCE,
}
EXPOSURES = {"advisory": ADVISORY, "severity": TEXT, "cluster": TEXT, "exposures": COUNT,
             "earliest_deadline": DATE_TIME, "nodes": {"type": "array", "items": TEXT}, "url": URL}
DATA: dict[str, dict[str, Any]] = {
    EventType.ADVISORY_INGESTED: _object({
        "advisory": ADVISORY, "title": TEXT, "severity": TEXT, "tracking_version": TEXT,
        "cves": {"type": "array", "items": TEXT}, "integrity": TEXT,
        "exposures_by_cluster": {"type": "object", "additionalProperties": COUNT}, "url": URL}),
    EventType.EXPOSURE_OVERDUE: _object(EXPOSURES),
    EventType.EXPOSURE_DUE_SOON: _object(EXPOSURES),
    EventType.CAMPAIGN_STATE: _object(CAMPAIGN),
    EventType.APPROVAL_REQUESTED: _object(CAMPAIGN),
    EventType.NODE_FAILED: _object({
        "node": TEXT, "cluster": TEXT, "campaign": COUNT, "campaign_name": TEXT, "sweep": COUNT, "state": TEXT,
        "error": TEXT, "evidence": EVIDENCE, "url": URL,
        # Workloads the failed sweep could restore nowhere: checkpoint kept, an operator must act.
        "stranded_workloads": {"type": "array", "items": {"type": "object"}},
        # Workloads no node took back that went to their scheduler instead (a Slurm job released, not held).
        "released_workloads": {"type": "array", "items": {"type": "object"}}}),
    EventType.TEST: _object({"requested_by": TEXT}),
}
BODY: dict[str, dict[str, Any]] = {
    kind: {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"gpusweep webhook {kind}",
           **_object({"id": COUNT, "type": {"const": kind}, "at": DATE_TIME, "subject": TEXT, "summary": TEXT,
                      "data": data})}
    for kind, data in DATA.items()
}


def component_name(kind: str) -> str:
    return "Webhook" + "".join(part.capitalize() for part in kind.replace("_", ".").split("."))


def _openapi_30(schema: Any) -> Any:
    """JSON Schema to OpenAPI 3.0's dialect: `nullable` for a null type, a one-value enum for `const`."""
    if isinstance(schema, list):
        return [_openapi_30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _openapi_30(v) for k, v in schema.items() if k != "$schema"}
    if isinstance(out.get("type"), list):
        types = [t for t in out["type"] if t != "null"]
        out["type"], out["nullable"] = types[0], True
    if "const" in out:
        out["enum"], out["type"] = [out.pop("const")], "string"
    return out


def add_to_openapi(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: one component per event body."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    for kind, body in BODY.items():
        schemas[component_name(kind)] = _openapi_30(copy.deepcopy(body))
    return result
