from __future__ import annotations

from gpusweep.choices import ChoiceSet


class EventType(ChoiceSet):
    ADVISORY_INGESTED = "advisory.ingested"
    EXPOSURE_OVERDUE = "exposure.overdue"
    EXPOSURE_DUE_SOON = "exposure.due_soon"
    CAMPAIGN_STATE = "campaign.state_changed"
    APPROVAL_REQUESTED = "campaign.approval_requested"
    NODE_FAILED = "node.failed"
    TEST = "test"
    CHOICES = [
        (ADVISORY_INGESTED, "A bulletin was ingested that affects the fleet"),
        (EXPOSURE_OVERDUE, "Exposures passed their deadline (per advisory and cluster)"),
        (EXPOSURE_DUE_SOON, "Exposures are due soon (per advisory and cluster)"),
        (CAMPAIGN_STATE, "A campaign changed state"),
        (APPROVAL_REQUESTED, "A campaign's plan waits for approval"),
        (NODE_FAILED, "A node failed in a campaign"),
        (TEST, "A test event sent from the settings page"),
    ]


class Template(ChoiceSet):
    """The body sent: gpusweep's own JSON, or what a ticketing system's create call takes."""

    GENERIC = "generic"
    JIRA = "jira"
    SERVICENOW_INCIDENT = "servicenow_incident"
    SERVICENOW_CHANGE = "servicenow_change"
    CHOICES = [
        (GENERIC, "Generic JSON"),
        (JIRA, "Jira: create issue (POST /rest/api/2/issue)"),
        (SERVICENOW_INCIDENT, "ServiceNow: incident (POST /api/now/table/incident)"),
        (SERVICENOW_CHANGE, "ServiceNow: change request (POST /api/now/table/change_request)"),
    ]


class DeliveryState(ChoiceSet):
    PENDING = "pending"
    RETRYING = "retrying"
    DELIVERED = "delivered"
    FAILED = "failed"  # gave up after the last attempt; a replay sends it again
    CHOICES = [
        (PENDING, "Pending"),
        (RETRYING, "Retrying"),
        (DELIVERED, "Delivered"),
        (FAILED, "Failed (gave up)"),
    ]
    WAITING = frozenset({PENDING, RETRYING})
