"""The campaign wizard's form: real lists to choose from, windows and blackouts as rows, a plan preview.

Validation and saving stay the services' (`services.definition_errors`, `create_campaign`), the
same rules the API applies; this module only turns form rows into the campaign's fields.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from advisories import counts
from advisories.choices import ExposureState
from advisories.identifiers import resolve_all
from advisories.models import Advisory, Exposure
from campaigns import services
from campaigns.choices import Placement
from campaigns.models import Campaign
from inventory.choices import ServiceState
from inventory.models import Cluster, Node

WINDOW_ROWS = 2
BLACKOUT_ROWS = 2
DAYS = [(str(i), name) for i, name in enumerate(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"])]
TIME_ZONES = ["UTC", "Europe/Berlin", "Europe/London", "America/New_York", "America/Chicago",
              "America/Los_Angeles", "Asia/Tokyo", "Asia/Singapore", "Australia/Sydney"]
HELP = {
    "name": "A name people will recognise in lists and reports.",
    "parallelism_per_cluster": 'How many nodes of one cluster are patched at once: "2" or "10%".',
    "parallelism_per_pool": 'Optional limit per pool, "1" or "25%"; empty for none.',
    "error_budget": 'Failed nodes tolerated before the campaign halts: "1", "5%", or "0" to halt at the first.',
    "canary": '"auto": one node per driver branch and cluster first; a number of nodes; "0" for no canary.',
    "soak_s": "Seconds to watch the canary before the next wave (0 to go straight on).",
    "growth_step": "Nodes added per wave (linear) or the factor (exponential).",
    "approvals_required": "Approvers (never the requester) who must approve the plan.",
    "deadline": "When every node must be patched (UTC); the plan flags waves that end later. Empty: the "
                "exposures' own deadlines.",
    "cold_restart_allowed": "When no node can take a checkpoint, stop the workload and let its scheduler start "
                            "it again.",
}

# Each field's label, written for people (the model's names are the API's).
LABELS = {
    "name": "Name",
    "description": "Description",
    "parallelism_per_cluster": "Nodes patched at once per cluster",
    "parallelism_per_pool": "Nodes patched at once per pool",
    "error_budget": "Failed nodes tolerated",
    "workload_policy": "What happens to the nodes' workloads",
    "workload_placement": "Where moved workloads go",
    "held_nodes": "Nodes held by someone else",
    "cold_restart_allowed": "Allow cold restarts",
    "canary": "Canary nodes",
    "soak_s": "Soak after the canary (seconds)",
    "wave_growth": "How the waves grow",
    "growth_step": "Wave growth step",
    "dcgm_level": "DCGM diagnostic level",
    "after_rollback": "After a rollback",
    "approvals_required": "Approvals required",
    "deadline": "Deadline (UTC)",
}


def advisory_choices() -> list[dict[str, Any]]:
    """Advisories by public id, with severity, exposed nodes (open and presumed), integrity and the text
    the wizard's search box matches (bulletin, title, CVEs); those affecting the fleet first, most exposed
    first."""
    found = counts.cached()  # the counts the advisory list shows
    rows = [{"id": a.public_id, "label": f"{a.publisher} {a.publisher_id}", "title": a.title,
             "severity": a.severity,
             "exposed": (found[a.pk].exposed_nodes + found[a.pk].presumed_nodes) if a.pk in found else 0,
             "mismatch": a.integrity == "mismatch",
             "search": " ".join([a.public_id, a.publisher, a.publisher_id, a.title,
                                 *(c.cve_id for c in a.cves.all())]).lower()}
            for a in Advisory.objects.prefetch_related("cves").order_by("-current_release_date", "-id")]
    return sorted(rows, key=lambda r: -r["exposed"])


class AdvisoriesField(forms.MultipleChoiceField):
    """Advisories chosen by their public id (``nvidia-5703``, the checkboxes' values): the database id
    never reaches the page. Cleaned to the advisories themselves."""

    widget = forms.CheckboxSelectMultiple

    def clean(self, value: Any) -> list[Advisory]:
        found, _unknown = resolve_all(list(super().clean(value)))  # an unknown id is no valid choice
        return found


def pool_choices() -> list[tuple[str, str]]:
    pools = (Node.objects.exclude(service_state=ServiceState.GONE).exclude(pool="")
             .values("pool").annotate(n=Count("id")).order_by("pool"))
    return [(p["pool"], f"{p['pool']} ({p['n']} nodes)") for p in pools]


class CampaignForm(forms.ModelForm):
    """The UI's campaign fields; validation and saving are the services' (the same as the API's)."""

    clusters = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                         help_text="None chosen: every cluster.")
    pools = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                      help_text="None chosen: every pool of the chosen clusters.")
    node_names = forms.CharField(required=False, label="Only these nodes",
                                 help_text="Optional, comma separated node names (from the exposure list's selection).")
    advisories = AdvisoriesField(required=False)
    site_check_names = forms.CharField(required=False, label="Site health checks",
                                       help_text="The agents' configured checks, comma separated; empty for all.")

    class Meta:
        model = Campaign
        fields = [
            "name", "description", "advisories",
            "parallelism_per_cluster", "parallelism_per_pool", "error_budget",
            "workload_policy", "workload_placement", "held_nodes", "cold_restart_allowed", "canary", "soak_s",
            "wave_growth", "growth_step", "dcgm_level", "after_rollback", "approvals_required", "deadline",
        ]
        widgets = {"deadline": forms.DateTimeInput(attrs={"type": "datetime-local"}),
                   "description": forms.Textarea(attrs={"rows": 2})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")  # labels as people read them, with no colon
        super().__init__(*args, **kwargs)
        advisories = self.fields["advisories"]
        assert isinstance(advisories, AdvisoriesField)
        advisories.choices = [(a.public_id, a.public_id) for a in Advisory.objects.only("publisher", "publisher_id")]
        clusters, pools = self.fields["clusters"], self.fields["pools"]
        assert isinstance(clusters, forms.MultipleChoiceField) and isinstance(pools, forms.MultipleChoiceField)
        clusters.choices = [(c, c) for c in Cluster.objects.values_list("name", flat=True)]
        pools.choices = pool_choices()
        # Left out of a form post, these take the model's defaults.
        for name in ("workload_placement", "held_nodes", "canary", "soak_s", "wave_growth", "growth_step",
                     "dcgm_level", "after_rollback"):
            self.fields[name].required = False
        for name, text in HELP.items():
            self.fields[name].help_text = text
        for name, label in LABELS.items():
            self.fields[name].label = label
        self.window_errors: list[str] = []

    def _rows(self) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
        data = self.data
        windows = []
        for i in range(WINDOW_ROWS):
            start, end = data.get(f"win_start_{i}", "").strip(), data.get(f"win_end_{i}", "").strip()
            if not start and not end:
                continue
            days = [int(d) for d in data.getlist(f"win_days_{i}") if d.isdigit()] if hasattr(data, "getlist") else []
            windows.append({"days": days or list(range(7)), "start": start, "end": end,
                            "tz": data.get(f"win_tz_{i}", "UTC") or "UTC"})
        blackouts = []
        for i in range(BLACKOUT_ROWS):
            start, end = data.get(f"bo_start_{i}", "").strip(), data.get(f"bo_end_{i}", "").strip()
            if start or end:
                blackouts.append({"start": _utc_iso(start), "end": _utc_iso(end)})
        return windows, blackouts

    def definition(self) -> dict[str, Any]:
        values = {k: v for k, v in self.cleaned_data.items() if k in services.DEFINITION_FIELDS}
        values["workload_placement"] = values.get("workload_placement") or Placement.MOVE
        for name in ("held_nodes", "canary", "soak_s", "wave_growth", "growth_step", "dcgm_level", "after_rollback"):
            if values.get(name) in (None, ""):
                values[name] = Campaign._meta.get_field(name).get_default()  # type: ignore[union-attr]
        values["clusters"] = list(self.cleaned_data.get("clusters") or [])
        values["pools"] = list(self.cleaned_data.get("pools") or [])
        values["site_checks"] = [n.strip() for n in (self.cleaned_data.get("site_check_names") or "").split(",")
                                 if n.strip()]
        names = [n.strip() for n in (self.cleaned_data.get("node_names") or "").split(",") if n.strip()]
        values["node_selector"] = {"names": names} if names else {}
        values["windows"], values["blackouts"] = self._rows()
        return values

    def advisory_ids(self) -> list[int]:
        return [a.pk for a in self.cleaned_data.get("advisories") or []]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            for name, message in services.definition_errors(self.definition()).items():
                if name in ("windows", "blackouts"):
                    self.window_errors.append(message)
                    self.add_error(None, f"{name}: {message}")
                else:
                    field = {"site_checks": "site_check_names"}.get(name, name)
                    self.add_error(field if field in self.fields else None, message)
        return cleaned


def _utc_iso(text: str) -> str:
    """A datetime-local value (read as UTC) as ISO 8601 with its offset."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        return text  # the service names what is wrong with it
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.isoformat()


def initial_from(query: Any) -> dict[str, Any]:
    """The wizard's starting values from a link: ?advisories=nvidia-5703&clusters=prod&nodes=a,b (advisories
    by public id)."""
    initial: dict[str, Any] = {}
    found, _unknown = resolve_all(query.getlist("advisories"))
    if found:
        initial["advisories"] = sorted({a.public_id for a in found})
        initial["name"] = "Patch " + ", ".join(sorted({a.publisher_id for a in found}))
    if query.getlist("clusters"):
        initial["clusters"] = query.getlist("clusters")
    if query.get("nodes"):
        initial["node_names"] = query.get("nodes")
    return initial


def matched(clusters: list[str], pools: list[str], names: list[str], advisories: list[int]) -> dict[str, int]:
    """How many nodes the scope selects, and how many of those the chosen advisories expose."""
    nodes = Node.objects.exclude(service_state=ServiceState.GONE)
    if clusters:
        nodes = nodes.filter(cluster__name__in=clusters)
    if pools:
        nodes = nodes.filter(pool__in=pools)
    if names:
        nodes = nodes.filter(name__in=names)
    exposed = Exposure.objects.filter(node__in=nodes, state__in=[ExposureState.OPEN, ExposureState.PRESUMED])
    if advisories:
        exposed = exposed.filter(advisory_id__in=advisories)
    return {"nodes": nodes.count(), "exposed": exposed.values("node").distinct().count()}


class _Rollback(Exception):
    pass


def preview(user: User, values: dict[str, Any], advisories: list[int]) -> dict[str, Any]:
    """The plan this definition would get now, computed on a campaign that is never kept."""
    content: dict[str, Any] = {}
    try:
        with transaction.atomic():
            campaign = services.create_campaign(user, values, advisories)
            content = services.compute_plan(campaign)
            raise _Rollback
    except _Rollback:
        pass
    return content
