"""The fleet's status per bulletin as a CSAF 2.0 VEX document (profile csaf_vex, section 4.5).

Each exposed node component is a product ("prod/gpu01 driver"); per CVE its exposure's state
sets the product status: open and risk-accepted -> known_affected (with the fix as a vendor_fix
remediation), remediated -> fixed, not_affected -> known_not_affected (with the approver's
justification as a flag), presumed -> under_investigation (the bulletin does not tell; the
remediation says what would end the doubt). Other tools (scanners, ticketing systems) read it as
they read NVIDIA's own documents. tests/advisories/test_vex.py validates it against the OASIS
CSAF 2.0 JSON schema.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from advisories.choices import ExposureState
from advisories.models import Advisory, Exposure

# The status a state gives a product, and which wins when one product has two exposures to a CVE.
STATUS = {
    ExposureState.OPEN: "known_affected",
    ExposureState.RISK_ACCEPTED: "known_affected",
    ExposureState.PRESUMED: "under_investigation",
    ExposureState.REMEDIATED: "fixed",
    ExposureState.NOT_AFFECTED: "known_not_affected",
}
PRECEDENCE = ["known_affected", "under_investigation", "fixed", "known_not_affected"]
NVIDIA_BULLETIN = "https://nvidia.custhelp.com/app/answers/detail/a_id/"


def _when(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _product_id(exposure: Exposure) -> str:
    return f"{exposure.node.cluster.name}/{exposure.node.name}/{exposure.component}"


def _version(exposure: Exposure) -> str:
    return exposure.fixed_by_version if exposure.state == ExposureState.REMEDIATED else exposure.detected_version


def vex_document(advisories: Iterable[Advisory], exposures: QuerySet[Exposure] | None = None,
                 now: dt.datetime | None = None) -> dict[str, Any]:
    """One VEX document for `advisories` (their CVEs) over the fleet's exposures to them."""
    now = now or timezone.now()
    advisories = list(advisories)
    rows = (exposures if exposures is not None else Exposure.objects.all()).filter(
        advisory__in=advisories).select_related("node__cluster", "affected_range").prefetch_related(
        "affected_range__cves").order_by("node__cluster__name", "node__name", "component", "id")
    products: dict[str, str] = {}
    # cve -> product -> (status, exposure)
    status: dict[str, dict[str, tuple[str, Exposure]]] = defaultdict(dict)
    for exposure in rows:
        pid = _product_id(exposure)
        products.setdefault(pid, f"{pid} {_version(exposure)}")
        state = STATUS[exposure.state]
        for cve in exposure.affected_range.cves.all():
            current = status[cve.cve_id].get(pid)
            if current is None or PRECEDENCE.index(state) < PRECEDENCE.index(current[0]):
                status[cve.cve_id][pid] = (state, exposure)
    cves = {c.cve_id: c for a in advisories for c in a.cves.all()}
    vulnerabilities = [_vulnerability(cves.get(cve_id), cve_id, status.get(cve_id) or NOTHING_EXPOSED)
                       for cve_id in sorted(set(cves) | set(status))]
    if any(not status.get(cve_id) for cve_id in cves):
        products["none"] = "no node of the fleet is exposed"
    bulletins = ", ".join(f"{a.publisher} {a.publisher_id}" for a in advisories) or "no bulletin"
    digest = hashlib.sha256(bulletins.encode()).hexdigest()[:12]
    return {
        "document": {
            "category": "csaf_vex",
            "csaf_version": "2.0",
            "title": f"Fleet status for {bulletins}",
            "publisher": {"category": "user", "name": settings.GPUSWEEP_VEX_PUBLISHER,
                          "namespace": settings.GPUSWEEP_VEX_NAMESPACE},
            "notes": [{"category": "summary", "title": "What this is", "text": (
                f"The exposure of this fleet's nodes to {bulletins}, as gpusweep computed it from the inventory "
                "and the bulletins' affected ranges. under_investigation marks nodes the bulletin does not "
                "decide (a row that could not be decoded, a driver branch it skips).")}],
            **({"references": references} if (references := [_reference(a) for a in advisories]) else {}),
            "tracking": {
                "id": f"gpusweep-vex-{digest}",
                "status": "interim",
                "version": "1",
                "initial_release_date": _when(now),
                "current_release_date": _when(now),
                "revision_history": [{"number": "1", "date": _when(now), "summary": "Generated from the inventory"}],
                "generator": {"engine": {"name": "gpusweep"}, "date": _when(now)},
            },
        },
        "product_tree": {"full_product_names": [{"name": name, "product_id": pid} for pid, name in sorted(
            (products or {"none": "no node of the fleet is exposed"}).items())]},
        "vulnerabilities": vulnerabilities,
    }


class _Nobody:
    """Stands for the empty fleet: VEX wants a status per vulnerability, so it is not affected."""

    state = ExposureState.NOT_AFFECTED
    justification = "component_not_present"
    risk_reason = "no node of the fleet runs an affected version"


NOTHING_EXPOSED: dict[str, tuple[str, Any]] = {"none": ("known_not_affected", _Nobody())}


def _reference(advisory: Advisory) -> dict[str, str]:
    """Where the bulletin is: its URL when it came from one, else NVIDIA's page for its id."""
    url = advisory.source if advisory.source.startswith(("http://", "https://")) else (
        f"{NVIDIA_BULLETIN}{advisory.publisher_id}")
    return {"category": "external", "summary": f"{advisory.publisher} {advisory.publisher_id}: {advisory.title}"[:1000],
            "url": url}


def _vulnerability(cve: Any, cve_id: str, by_product: dict[str, tuple[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[str]] = defaultdict(list)
    for pid, (state, _exposure) in sorted(by_product.items()):
        groups[state].append(pid)
    entry: dict[str, Any] = {
        "cve": cve_id,
        "notes": [{"category": "description", "title": "Description",
                   "text": (cve.description if cve is not None and cve.description else cve_id)}],
    }
    if groups:
        entry["product_status"] = {k: groups[k] for k in PRECEDENCE if groups.get(k)}
    remediations: list[dict[str, Any]] = []
    fixes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pid, (state, exposure) in sorted(by_product.items()):
        if state in ("known_affected", "under_investigation"):
            rng = exposure.affected_range
            text = rng.remediation or (f"update to {rng.fixed_version}" if rng.fixed_version else "")
            category = "vendor_fix" if rng.fixed_version else "none_available"
            fixes[(category, text or "no fixed version is known")].append(pid)
    for (category, text), pids in sorted(fixes.items()):
        remediations.append({"category": category, "details": text, "product_ids": pids})
    if remediations:
        entry["remediations"] = remediations
    justified: dict[str, list[str]] = defaultdict(list)
    reasons: dict[str, list[str]] = defaultdict(list)
    for pid, (state, exposure) in sorted(by_product.items()):
        if state == "known_not_affected":
            justified[exposure.justification or "vulnerable_code_not_in_execute_path"].append(pid)
            reasons[exposure.risk_reason or "an approver found it not affected"].append(pid)
    if justified:
        entry["flags"] = [{"label": label, "product_ids": pids} for label, pids in sorted(justified.items())]
        entry["threats"] = [{"category": "impact", "details": reason, "product_ids": pids}
                            for reason, pids in sorted(reasons.items())]
    return entry
