"""What each auditor's report says, as plain data (JSON types only); render.py turns it into
JSON, CSV and PDF, so the three formats of a report never disagree.

Reports read the other apps' tables and write none: a campaign report signs the current evidence
heads for itself without storing the seal (``campaigns.evidence.export_for_reading``), so the signed
head it prints is one an auditor can check the exported log against, and a GET writes nothing.

Every report starts with ``report``: its title, when and by whom it was made, what it covers
and how to verify it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from advisories import coverage, findings
from advisories.choices import ExposureState
from advisories.models import Advisory, AffectedRange, Exposure, public_id
from advisories.osv import OS_PACKAGE
from campaigns import evidence, signing
from campaigns.choices import CampaignStatus, EvidenceKind, MoveState, SweepState
from campaigns.models import Campaign, EvidenceEvent, NodeSweep
from inventory.models import Cluster

VERIFY_EVIDENCE = ("Download the evidence export (GET /campaigns/{id}/evidence.json, or manage.py export_evidence "
                   "{id}) and the public key (manage.py evidence_key), then run `python -m campaigns.verify "
                   "EXPORT.json --public-key KEY.pem`: it recomputes every hash chain and checks the signed seal. "
                   "The signed seal printed here (its number, campaign head and Merkle root) must be in the export "
                   "with the same values; the campaign head now is one event later, the 'sealed' event that records "
                   "the seal in the chain itself.")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _header(title: str, covers: str, verify: str, actor: str) -> dict[str, Any]:
    return {"title": title, "generated_at": _iso(timezone.now()), "generated_by": actor, "covers": covers,
            "how_to_verify": verify}


def _advisory_summary(advisory: Advisory) -> dict[str, Any]:
    return {"id": advisory.public_id, "publisher_id": advisory.publisher_id, "title": advisory.title,
            "severity": advisory.severity, "integrity": advisory.integrity,
            "content_sha256": advisory.content_sha256,
            "cves": [{"cve": c.cve_id, "base_score": c.base_score, "severity": c.severity}
                     for c in advisory.cves.all().order_by("cve_id")]}


def _node_times(campaign: Campaign) -> dict[int, dict[str, str]]:
    """Per sweep: when it was admitted and when it ended, from its evidence chain."""
    times: dict[int, dict[str, str]] = {}
    ends = (EvidenceKind.DONE, EvidenceKind.FAILED, EvidenceKind.ROLLED_BACK, EvidenceKind.SKIPPED)
    for sweep_id, kind, at in (EvidenceEvent.objects.filter(campaign=campaign, sweep__isnull=False)
                               .order_by("sweep_id", "node_seq").values_list("sweep_id", "kind", "at")):
        entry = times.setdefault(int(sweep_id), {})
        entry.setdefault("started_at", at.isoformat())
        if kind in ends:
            entry["finished_at"] = at.isoformat()
    return times


# Evidence of a move that carries the workload's own progress marker (the counter's step): at the
# checkpoint ("steps") and where it resumed ("steps_before"/"steps_after").
PROGRESS_KINDS = (EvidenceKind.CHECKPOINTED, EvidenceKind.PARKED, EvidenceKind.RESTORED, EvidenceKind.RETURNED,
                  EvidenceKind.RECOVERED)


def _progress(campaign: Campaign) -> dict[str, dict[str, int]]:
    """Checkpoint id -> the progress its workload reported, from the evidence: ``before`` at the
    checkpoint, ``after`` once it ran again (for a move whose own row lacks them)."""
    found: dict[str, dict[str, int]] = {}
    for kind, data in (EvidenceEvent.objects.filter(campaign=campaign, kind__in=PROGRESS_KINDS)
                       .order_by("at", "pk").values_list("kind", "data")):
        if not isinstance(data, dict) or not data.get("checkpoint_id"):
            continue
        entry = found.setdefault(str(data["checkpoint_id"]), {})
        before = data.get("steps") if kind in (EvidenceKind.CHECKPOINTED, EvidenceKind.PARKED) \
            else data.get("steps_before")
        if isinstance(before, int):
            entry.setdefault("before", before)
        if isinstance(data.get("steps_after"), int) and kind not in (EvidenceKind.CHECKPOINTED, EvidenceKind.PARKED):
            entry["after"] = data["steps_after"]
    return found


def _nodes(campaign: Campaign) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    times = _node_times(campaign)
    progress = _progress(campaign)
    nodes, moves = [], []
    sweeps = (NodeSweep.objects.filter(campaign=campaign).select_related("node__cluster")
              .prefetch_related("moves__target_node").order_by("wave", "position", "pk"))
    for sweep in sweeps:
        when = times.get(sweep.pk, {})
        started, finished = when.get("started_at"), when.get("finished_at")
        duration = (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds() \
            if started and finished else None
        nodes.append({
            "node": sweep.node.name, "cluster": sweep.node.cluster.name, "pool": sweep.node.pool, "wave": sweep.wave,
            "state": sweep.state, "versions_before": sweep.versions_before, "versions_after": sweep.versions_after,
            "target": sweep.target, "remedy": sweep.planned.get("remedy", ""),
            "planned_start": sweep.planned.get("expected_start"),
            "started_at": started, "patched_at": _iso(sweep.patched_at), "finished_at": finished,
            "duration_s": duration, "attempts": sweep.attempt, "error": sweep.error,
            "evidence_head": sweep.evidence_head, "signed": bool(sweep.head_signature),
        })
        for move in sweep.moves.all():
            reported = progress.get(move.checkpoint_id, {}) if move.checkpoint_id else {}
            before = move.steps_before if move.steps_before is not None else reported.get("before")
            after = move.steps_after if move.steps_after is not None else reported.get("after")
            moves.append({
                "node": sweep.node.name, "workload": move.workload_name or move.workload_ref, "gpus": move.gpus,
                "policy": move.policy, "state": move.state,
                "target_node": move.target_node.name if move.target_node else None,
                "checkpoint_id": move.checkpoint_id, "checkpoint_sha256": move.checkpoint_sha256,
                # The workload's own progress marker (a counter's step) when it was checkpointed and once it
                # ran again; None where the workload reports none (render prints "not reported").
                "steps_before": before, "steps_after": after,
            })
    return nodes, moves


def _exceptions(campaign: Campaign, nodes: list[dict[str, Any]], moves: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for node in nodes:
        if node["state"] in (SweepState.FAILED, SweepState.ROLLED_BACK, SweepState.SKIPPED):
            found.append({"kind": f"node {node['state']}", "subject": node["node"], "detail": node["error"]})
    for move in moves:
        if move["state"] in (MoveState.FAILED, MoveState.COLD_STARTED, MoveState.STOPPED):
            found.append({"kind": f"workload {move['state']}", "subject": f"{move['workload']} on {move['node']}",
                          "detail": f"policy {move['policy']}"})
    plan = campaign.approved_plan
    if plan is not None:
        for item in plan.content.get("blocked", []):
            found.append({"kind": "blocked in plan", "subject": item.get("name"), "detail": item.get("reason", "")})
        for item in plan.content.get("cold_starts", []):
            found.append({"kind": "planned cold start", "subject": str(item.get("workload", item)),
                          "detail": str(item.get("why", ""))})
    accepted = Exposure.objects.filter(advisory__in=campaign.advisories.all(), state=ExposureState.RISK_ACCEPTED,
                                       node__sweeps__campaign=campaign).select_related("node", "risk_approver")
    for exposure in accepted.distinct():
        found.append({"kind": "risk accepted", "subject": exposure.node.name,
                      "detail": f"{exposure.risk_reason} (by {exposure.risk_approver}, until "
                                f"{_iso(exposure.risk_expires_at)})"})
    if campaign.status_reason:
        found.append({"kind": f"campaign {campaign.status}", "subject": campaign.name,
                      "detail": campaign.status_reason})
    return found


def campaign_report(campaign_id: int, actor: str) -> dict[str, Any]:
    exported = evidence.export_for_reading(campaign_id)  # a GET writes nothing: an unstored "export" seal
    campaign = Campaign.objects.select_related("requested_by", "approved_plan__created_by").get(pk=campaign_id)
    problems = evidence.verify_campaign(campaign)
    seal = exported["seals"][-1] if exported["seals"] else None
    nodes, moves = _nodes(campaign)
    plan = campaign.approved_plan or campaign.plans.order_by("-version").first()
    return {
        "report": _header(
            f"Campaign {campaign.pk}: {campaign.name}",
            f"Campaign {campaign.pk} ({campaign.status}) from its creation to {_iso(timezone.now())}: scope, "
            f"advisories and CVEs, the plan and its approvals, every node swept ({len(nodes)}) with versions "
            f"before and after and timings, every workload moved ({len(moves)}), exceptions, "
            "and the evidence log's verification.",
            VERIFY_EVIDENCE.replace("{id}", str(campaign.pk)), actor),
        "campaign": {
            "id": campaign.pk, "name": campaign.name, "description": campaign.description, "status": campaign.status,
            "requested_by": str(campaign.requested_by or ""), "created_at": _iso(campaign.created_at),
            "started_at": _iso(campaign.started_at), "finished_at": _iso(campaign.finished_at),
            "deadline": _iso(campaign.deadline),
        },
        "scope": {
            "clusters": campaign.clusters or "all", "pools": campaign.pools or "all",
            "node_selector": campaign.node_selector, "last_group": campaign.last_group,
            "target_versions": campaign.target_versions, "windows": campaign.windows,
            "blackouts": campaign.blackouts, "parallelism_per_cluster": campaign.parallelism_per_cluster,
            "parallelism_per_pool": campaign.parallelism_per_pool, "error_budget": campaign.error_budget,
            "workload_policy": campaign.workload_policy, "workload_placement": campaign.workload_placement,
            "canary": campaign.canary, "approvals_required": campaign.approvals_required,
        },
        "advisories": [_advisory_summary(a) for a in campaign.advisories.prefetch_related("cves").order_by("pk")],
        "plan": None if plan is None else {
            "version": plan.version, "created_at": _iso(plan.created_at), "created_by": str(plan.created_by or ""),
            "approved": campaign.approved_plan_id == plan.pk, "summary": plan.summary or plan.content.get("summary"),
            "waves": [{"wave": w["wave"], "start": w["start"], "end": w["end"], "nodes": len(w["nodes"])}
                      for w in plan.content.get("waves", [])],
        },
        "approvals": [{"user": str(a.user), "plan_version": a.plan.version, "at": _iso(a.at), "comment": a.comment}
                      for a in campaign.approvals.select_related("user", "plan").order_by("at")],
        "nodes": nodes,
        "moves": moves,
        "exceptions": _exceptions(campaign, nodes, moves),
        "verification": {
            "intact": not problems, "problems": problems,
            "campaign_seq": exported["campaign"]["evidence_seq"],
            "campaign_head": exported["campaign"]["evidence_head"],
            "seal": None if seal is None else {
                "number": seal["number"], "at": seal["at"], "root": seal["body"].get("root"),
                "campaign_head": seal["body"].get("campaign_head"), "signature": seal["signature"],
                "key_id": seal["key_id"]},
            # The key's fingerprint, never the key: the key reaches the auditor separately (README).
            "public_key_sha256": signing.key_id(), "events": len(exported["events"]),
        },
    }


def advisory_report(advisory_id: int, actor: str) -> dict[str, Any]:
    advisory = Advisory.objects.prefetch_related("cves").get(pk=advisory_id)
    rows: list[dict[str, Any]] = []
    fixed = dict(AffectedRange.objects.filter(advisory=advisory).values_list("pk", "fixed_version"))
    named = _packages(AffectedRange.objects.filter(advisory=advisory))
    clusters = dict(Cluster.objects.values_list("pk", "name"))
    approvers = dict(User.objects.values_list("pk", "username"))
    columns = ("node__name", "node__cluster_id", "component", "detected_version", "affected_range_id", "state",
               "first_seen", "deadline", "fixed_by_version", "remediated_at", "remediated_by", "risk_reason",
               "risk_approver_id", "risk_expires_at", "justification")
    now = timezone.now()
    # Tuples, not model instances: one bulletin can hit most of a fleet (see pending_report).
    found = Exposure.objects.filter(advisory=advisory).order_by("node__name", "pk").values(*columns)
    for row in found.iterator(10_000):
        state = row["state"]
        rows.append({
            "node": row["node__name"], "cluster": clusters.get(row["node__cluster_id"], ""),
            "component": named.get(row["affected_range_id"], row["component"]),
            "detected_version": row["detected_version"],
            "fixed_version": fixed.get(row["affected_range_id"], ""), "state": state,
            "first_seen": _iso(row["first_seen"]), "deadline": _iso(row["deadline"]),
            "overdue": state == ExposureState.OPEN and row["deadline"] is not None and row["deadline"] < now,
            "fixed_by_version": row["fixed_by_version"], "remediated_at": _iso(row["remediated_at"]),
            "remediated_by": row["remediated_by"],
            "risk": f"{row['risk_reason']} (by {approvers.get(row['risk_approver_id'], '?')}, until "
                    f"{_iso(row['risk_expires_at'])})" if state == ExposureState.RISK_ACCEPTED else "",
            "justification": row["justification"],
        })
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["state"])] = counts.get(str(row["state"]), 0) + 1
    return {
        "report": _header(
            f"Advisory {advisory.publisher_id}: {advisory.title}",
            f"Every node found exposed to {advisory.publisher} {advisory.publisher_id} (tracking version "
            f"{advisory.tracking_version}) since it was ingested, {len(rows)} in all, each with its outcome: "
            "remediated (by which campaign sweep or version), open with its deadline, risk accepted, or not affected.",
            "Each remediated row names the sweep (remediated_by, 'campaign:sweep'); that campaign's report and "
            "evidence export prove the patch (python -m campaigns.verify). The advisory's content SHA-256 printed "
            "here must equal the published file's (integrity).", actor),
        "advisory": {**_advisory_summary(advisory), "publisher": advisory.publisher,
                     "initial_release_date": _iso(advisory.initial_release_date),
                     "current_release_date": _iso(advisory.current_release_date),
                     "published_sha256": advisory.published_sha256},
        "counts": counts,
        "coverage": coverage.of_advisory(advisory).as_dict(),
        "exposures": rows,
    }


def _packages(ranges: Any) -> dict[int, str]:
    """Range id -> "package <source package>" for a distribution advisory's ranges: what its rows name
    (their exposure's component is only "os_package")."""
    return {pk: f"package {scope.get('package')}" for pk, scope in ranges.filter(component=OS_PACKAGE).values_list(
        "pk", "scope") if scope.get("package")}


def _scheduled() -> dict[int, list[dict[str, Any]]]:
    """Node id -> the live campaigns that will sweep it, each with its planned date (earliest first).

    A campaign covers a node's exposure when it names the exposure's advisory (or names none) and
    targets the exposure's component (or targets nothing in particular).
    """
    found: dict[int, list[dict[str, Any]]] = {}
    live = Campaign.objects.exclude(status__in=CampaignStatus.TERMINAL).prefetch_related("advisories")
    for campaign in live:
        if campaign.status in (CampaignStatus.DRAFT, CampaignStatus.PLANNED, CampaignStatus.APPROVED) \
                and not campaign.sweeps.exists():
            plan = campaign.approved_plan or campaign.plans.order_by("-version").first()
            items = [(int(k), v.get("expected_start")) for k, v in (plan.content.get("nodes") or {}).items()] \
                if plan else []
        else:
            items = list(campaign.sweeps.exclude(state__in=SweepState.TERMINAL)
                         .values_list("node_id", "planned__expected_start"))
        covers = {"advisories": {a.pk for a in campaign.advisories.all()},
                  "components": set(campaign.target_versions or {}), "campaign": campaign.pk,
                  "campaign_name": campaign.name, "campaign_status": campaign.status}
        for node_id, start in items:
            found.setdefault(int(node_id), []).append({**covers, "scheduled_for": start})
    for entries in found.values():
        entries.sort(key=lambda e: e["scheduled_for"] or "~")
    return found


def _covering(entries: list[dict[str, Any]], advisory_id: int, component: str) -> dict[str, Any] | None:
    for entry in entries:
        if (not entry["advisories"] or advisory_id in entry["advisories"]) and \
                (not entry["components"] or component in entry["components"]):
            return entry
    return None


def pending_report(actor: str, cluster: str | None = None) -> dict[str, Any]:
    scheduled = _scheduled()
    # One row per node and CVE: an NVIDIA row the distribution's package decides is that row's patch.
    exposures = Exposure.objects.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED]).exclude(
        findings.merged())
    if cluster:
        exposures = exposures.filter(node__cluster__name=cluster)
    # Plain tuples and small lookup tables: a fleet has hundreds of thousands of pending rows, and
    # building a model instance (with its node, advisory and range) for each took minutes.
    advisories = {pk: public_id(publisher, number)  # public ids: the database id stays inside
                  for pk, publisher, number in Advisory.objects.values_list("pk", "publisher", "publisher_id")}
    fixed = dict(AffectedRange.objects.values_list("pk", "fixed_version"))
    named = _packages(AffectedRange.objects.all())
    clusters = dict(Cluster.objects.values_list("pk", "name"))
    now = timezone.now()
    rows: list[dict[str, Any]] = []
    columns = ("node_id", "node__name", "node__cluster_id", "advisory_id", "affected_range_id", "severity",
               "component", "detected_version", "state", "deadline")
    for (node_id, node, cluster_id, advisory_id, range_id, severity, component, version, state,
         deadline) in exposures.order_by("deadline", "node__name", "pk").values_list(*columns).iterator(10_000):
        plan = _covering(scheduled.get(node_id, []), advisory_id, component) if scheduled else None
        rows.append({
            "node": node, "cluster": clusters.get(cluster_id, ""), "advisory": advisories.get(advisory_id, ""),
            "severity": severity, "component": named.get(range_id, component), "detected_version": version,
            "fixed_version": fixed.get(range_id, ""), "state": state, "deadline": _iso(deadline),
            "overdue": deadline is not None and deadline < now,
            "campaign": plan["campaign"] if plan else None, "campaign_name": plan["campaign_name"] if plan else "",
            "campaign_status": plan["campaign_status"] if plan else "",
            "scheduled_for": plan["scheduled_for"] if plan else None,
        })
    unscheduled = sum(1 for r in rows if r["campaign"] is None)
    late = sum(1 for r in rows if r["scheduled_for"] and r["deadline"] and str(r["scheduled_for"]) > str(r["deadline"]))
    return {
        "report": _header(
            "Pending patches" + (f" in cluster {cluster}" if cluster else ""),
            f"Every open or presumed exposure{' in cluster ' + cluster if cluster else ''} on {_iso(now)} "
            f"({len(rows)}), with its deadline and the date of the campaign scheduled to sweep its node "
            f"(the plan's expected start). {unscheduled} have no campaign yet; {late} are scheduled after their "
            "deadline.",
            "Each scheduled date is the approved (or newest) plan's expected start for that node; the campaign's "
            "own report and evidence export show when the node was actually patched.", actor),
        "summary": {"exposures": len(rows), "unscheduled": unscheduled, "scheduled_after_deadline": late,
                    "overdue": sum(1 for r in rows if r["overdue"] is True)},
        "exposures": rows,
    }
