"""What a subscription's receiver is sent: gpusweep's own JSON, a Jira issue, a ServiceNow record.

Pure functions of the event and the subscription's options. Every body carries the event id
(as ``correlation_id`` / a label) so a ticketing system can tell a retry from a new event.
"""

from __future__ import annotations

import json
from typing import Any

from webhooks import wire
from webhooks.choices import EventType, Template

SEVERITY_PRIORITY = {"critical": "Highest", "high": "High", "medium": "Medium", "low": "Low"}
# ServiceNow's 1 (high) to 3 (low) urgency and impact.
SEVERITY_URGENCY = {"critical": "1", "high": "1", "medium": "2", "low": "3"}


def generic(event: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    return {"id": event["id"], "type": event["kind"], "at": event["at"], "subject": event["subject"],
            "summary": event["summary"], "data": event["data"]}


def _description(event: dict[str, Any]) -> str:
    return f"{event['summary']}\n\nEvent {event['id']} ({event['kind']}) at {event['at']}\n\n" + json.dumps(
        event["data"], indent=2, sort_keys=True, default=str)[:20000]


def jira(event: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    severity = str(event["data"].get("severity", "")).lower()
    fields: dict[str, Any] = {
        "project": {"key": options.get("project", "SEC")},
        "issuetype": {"name": options.get("issue_type", "Task")},
        "summary": event["summary"][:250],
        "description": _description(event),
        "labels": ["gpusweep", event["kind"].replace(".", "-"), f"gpusweep-event-{event['id']}"],
    }
    if severity in SEVERITY_PRIORITY and options.get("set_priority", True):
        fields["priority"] = {"name": SEVERITY_PRIORITY[severity]}
    return {"fields": fields}


def servicenow_incident(event: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    severity = str(event["data"].get("severity", "")).lower()
    urgency = SEVERITY_URGENCY.get(severity, "2")
    body = {"short_description": event["summary"][:160], "description": _description(event),
            "urgency": urgency, "impact": urgency, "category": options.get("category", "security"),
            "correlation_id": f"gpusweep-{event['id']}", "correlation_display": "gpusweep"}
    if options.get("assignment_group"):
        body["assignment_group"] = options["assignment_group"]
    return body


def servicenow_change(event: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    data = event["data"]
    body = {"short_description": event["summary"][:160], "description": _description(event),
            "type": options.get("type", "normal"), "category": options.get("category", "Software"),
            "justification": "Security bulletin remediation (gpusweep campaign)",
            "correlation_id": f"gpusweep-{event['id']}", "correlation_display": "gpusweep"}
    if event["kind"] in (EventType.CAMPAIGN_STATE, EventType.APPROVAL_REQUESTED):
        body["start_date"] = data.get("expected_start") or data.get("started_at") or ""
        body["end_date"] = data.get("expected_end") or data.get("finished_at") or ""
    if options.get("assignment_group"):
        body["assignment_group"] = options["assignment_group"]
    return body


BUILDERS = {Template.GENERIC: generic, Template.JIRA: jira, Template.SERVICENOW_INCIDENT: servicenow_incident,
            Template.SERVICENOW_CHANGE: servicenow_change}


def body_for(template: str, event: dict[str, Any], options: dict[str, Any]) -> bytes:
    """The exact bytes sent (and signed)."""
    # Normalized again here: events stored before one date format and absolute links go out in it too.
    event = wire.normalize(event)
    return json.dumps(BUILDERS[template](event, options or {}), sort_keys=True, separators=(",", ":"),
                      default=str).encode()
