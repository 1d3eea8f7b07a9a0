"""The fleet's status per bulletin as a CSAF 2.0 VEX document (profile csaf_vex, section 4.5).

Each exposed node component is a product ("prod/gpu01 driver"; a distribution package by its
source package, "prod/gpu01/linux-nvidia"); per CVE its exposure's state
sets the product status: open and risk-accepted -> known_affected (with the fix as a vendor_fix
remediation), remediated -> fixed, not_affected -> known_not_affected (with the approver's
justification as a flag), presumed -> under_investigation (the bulletin does not tell; the
remediation says what would end the doubt). Where a distribution packages the software (an NVIDIA
driver from Ubuntu's archive), the node and CVE are one finding (advisories.findings) whose
deciding source, the distribution's advisory, sets the status in NVIDIA's bulletin's VEX too.
Other tools (scanners, ticketing systems) read it as they read NVIDIA's own documents.
tests/advisories/test_vex.py validates it against the OASIS CSAF 2.0 JSON schema
and its mandatory and recommended tests.

A distribution's advisory speaks of its releases' packages: a node on such a release whose package
set holds no binary of the range's source package is known_not_affected (component_not_present),
one whose package is outside the range vulnerable_code_not_present, one with the source's kernel
installed but another running vulnerable_code_not_in_execute_path (advisories.osmatch.not_affected);
a node on a release the advisory does not cover, or with no package set, gets no statement.

It says only what is known. A node component of the inventory that no range of the CVE matched
is known_not_affected (vulnerable_code_not_present: its version is outside every range) only
when its bulletin has no open review item and its version parses; otherwise, and for a CVE no
node's component can be checked against (the component is in no inventory), under_investigation.
Never "not affected" by default, and never for a bulletin still under review, except where an
approver decided it (with the justification they gave).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from advisories import components, cvss, findings, osmatch
from advisories.choices import ExposureState, ReviewState
from advisories.models import Advisory, AffectedRange, Exposure
from advisories.osv import OS_PACKAGE
from inventory.models import Node, NodeComponent

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
OSV_PAGE = "https://osv.dev/vulnerability/"


def _when(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _product_id(exposure: Exposure) -> str:
    """"prod/gpu01/driver"; a distribution package by its source package: "prod/gpu01/linux-nvidia"."""
    part = exposure.component
    if part == OS_PACKAGE:
        part = str((exposure.affected_range.scope or {}).get("package") or part)
    return f"{exposure.node.cluster.name}/{exposure.node.name}/{part}"


def _version(exposure: Exposure) -> str:
    return exposure.fixed_by_version if exposure.state == ExposureState.REMEDIATED else exposure.detected_version


def vex_document(advisories: Iterable[Advisory], exposures: QuerySet[Exposure] | None = None,
                 now: dt.datetime | None = None, inventory: bool = True) -> dict[str, Any]:
    """One VEX document for `advisories` (their CVEs) over the fleet's exposures to them, and
    (`inventory`) over the inventory's components that no range matched (the module docstring)."""
    now = now or timezone.now()
    advisories = list(advisories)
    rows = (exposures if exposures is not None else Exposure.objects.all()).filter(
        advisory__in=advisories).select_related("node__cluster", "affected_range").prefetch_related(
        "affected_range__cves").order_by("node__cluster__name", "node__name", "component", "id")
    products: dict[str, str] = {}
    # cve -> product -> (status, exposure)
    status: dict[str, dict[str, tuple[str, Exposure]]] = defaultdict(dict)
    listed = list(rows)
    joined = findings.joined({e.node_id for e in listed})
    deciders = _deciders(joined)
    for exposure in listed:
        pid = _product_id(exposure)
        products.setdefault(pid, f"{pid} {_version(exposure)}")
        for cve in exposure.affected_range.cves.all():
            # Where the distribution packages the software, its advisory decides this bulletin's status too
            # (one finding per node and CVE): its state, and its fix as the remediation.
            found = joined.get((exposure.node_id, cve.cve_id))
            decider = exposure
            if found is not None and exposure.id not in {d.exposure_id for d in found.deciding}:
                decider = deciders.get(found.deciding[0].exposure_id, exposure)
            state = STATUS[found.state if decider is not exposure and found is not None else exposure.state]
            current = status[cve.cve_id].get(pid)
            if current is None or PRECEDENCE.index(state) < PRECEDENCE.index(current[0]):
                status[cve.cve_id][pid] = (state, decider)
    cves = {c.cve_id: c for a in advisories for c in a.cves.all()}
    if inventory:
        _unexposed(advisories, status, products)
    vulnerabilities = [_vulnerability(cves.get(cve_id), cve_id, status.get(cve_id) or NOTHING_KNOWN)
                       for cve_id in sorted(set(cves) | set(status))]
    if any(not status.get(cve_id) for cve_id in cves):
        products[UNKNOWN] = "no node of the fleet reports a component of this bulletin"
    bulletins = ", ".join(f"{a.publisher} {a.publisher_id}" for a in advisories) or "no bulletin"
    digest = hashlib.sha256(bulletins.encode()).hexdigest()[:12]
    namespace = settings.GPUSWEEP_VEX_NAMESPACE.rstrip("/")
    self_ref = {"category": "self", "summary": "This document",
                "url": f"{namespace}/vex/gpusweep-vex-{digest}.json"}
    return _sorted({
        "document": {
            "category": "csaf_vex",
            "csaf_version": "2.0",
            "lang": "en",
            "title": f"Fleet status for {bulletins}",
            "publisher": {"category": "user", "name": settings.GPUSWEEP_VEX_PUBLISHER,
                          "namespace": settings.GPUSWEEP_VEX_NAMESPACE},
            "notes": [{"category": "summary", "title": "What this is", "text": (
                f"The exposure of this fleet's nodes to {bulletins}, as gpusweep computed it from the inventory "
                "and the bulletins' affected ranges. under_investigation marks nodes the bulletin does not "
                "decide (a row that could not be decoded, a driver branch it skips).")}],
            "references": [self_ref, *(_reference(a) for a in advisories)],
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
        "product_tree": {"full_product_names": [
            {"name": name, "product_id": pid, "product_identification_helper": {"x_generic_uris": [
                {"namespace": f"{namespace}/inventory", "uri": f"{namespace}/inventory/{quote(pid)}"}]}}
            for pid, name in sorted(
                (products or {UNKNOWN: "no node of the fleet reports a component of this bulletin"}).items())]},
        "vulnerabilities": vulnerabilities,
    })


def _deciders(joined: dict[tuple[int, str], findings.Finding]) -> dict[int, Exposure]:
    """The deciding exposures of the findings, by id, with what the VEX reads of them."""
    ids = {s.exposure_id for f in joined.values() for s in f.deciding}
    return Exposure.objects.select_related("affected_range").in_bulk(ids) if ids else {}


def _sorted(value: Any) -> Any:
    """Object keys in alphabetical order (CSAF's recommended test 6.2.13); lists keep theirs."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _scores(cve: Any, by_product: dict[str, tuple[str, Any]]) -> list[dict[str, Any]]:
    """The CVE's CVSS v3 score for the products it affects (recommended test 6.2.3), the score
    computed from the vector (see advisories/cvss.py)."""
    affected = sorted(pid for pid, (state, _e) in by_product.items() if state == "known_affected")
    vector = getattr(cve, "cvss_vector", "") or ""
    score = cvss.base_score(vector)
    if not affected or score is None:
        return []
    return [{"cvss_v3": {"version": vector[5:8], "vectorString": vector, "baseScore": score,
                         "baseSeverity": cvss.severity(score)}, "products": affected}]


@dataclass(frozen=True)
class _Remedy:
    remediation: str
    fixed_version: str = ""


class _Unexposed:
    """A node component no range of the CVE matched: known_not_affected when nothing is in doubt,
    under_investigation otherwise; it stands where an exposure would."""

    def __init__(self, status: str, reason: str, remediation: str = "",
                 justification: str = "vulnerable_code_not_present") -> None:
        self.state = ExposureState.NOT_AFFECTED if status == "known_not_affected" else ExposureState.PRESUMED
        self.justification = justification
        self.risk_reason = reason
        self.affected_range = _Remedy(remediation)  # read like an exposure's range


UNKNOWN = "fleet"
# VEX wants a status per vulnerability: with no node to speak of, it is under investigation.
NOTHING_KNOWN: dict[str, tuple[str, Any]] = {UNKNOWN: ("under_investigation", _Unexposed(
    "under_investigation", "", "no node of the fleet reports a component of this bulletin: check the nodes "
    "that run it"))}


def _unexposed(advisories: list[Advisory], status: dict[str, dict[str, tuple[str, Any]]],
               products: dict[str, str]) -> None:
    """Adds to `status` every inventory component of a CVE's ranges that no exposure names."""
    doubtful = {a.id for a in advisories if a.review_items.filter(state=ReviewState.OPEN).exists()}
    cve_components: dict[str, set[str]] = defaultdict(set)
    cve_doubt: dict[str, bool] = defaultdict(bool)
    for cve_id, component, advisory_id in AffectedRange.objects.filter(
            advisory__in=advisories, cves__isnull=False).values_list("cves__cve_id", "component", "advisory_id"):
        cve_components[cve_id].add(component)
        cve_doubt[cve_id] |= advisory_id in doubtful
    _unexposed_packages(advisories, status, products, cve_doubt)
    wanted = {c for names in cve_components.values() for c in names}
    fleet = list(NodeComponent.objects.filter(component__in=wanted).select_related("node__cluster").order_by(
        "node__cluster__name", "node__name", "component"))
    for cve_id, names in sorted(cve_components.items()):
        for nc in fleet:
            pid = f"{nc.node.cluster.name}/{nc.node.name}/{nc.component}"
            if nc.component not in names or pid in status[cve_id]:
                continue
            products.setdefault(pid, f"{pid} {nc.version}")
            label = components.by_name(nc.component)
            if cve_doubt[cve_id] or nc.version_key is None:
                why = ("its bulletin has open review items" if cve_doubt[cve_id] else
                       f"version {nc.version!r} does not parse")
                status[cve_id][pid] = ("under_investigation", _Unexposed(
                    "under_investigation", "", f"no decoded range matches {nc.version}, but {why}: review it"))
            else:
                status[cve_id][pid] = ("known_not_affected", _Unexposed(
                    "known_not_affected", f"{label.label if label else nc.component} {nc.version} is outside every "
                    "affected range of the bulletin"))


def _unexposed_packages(advisories: list[Advisory], status: dict[str, dict[str, tuple[str, Any]]],
                        products: dict[str, str], cve_doubt: dict[str, bool]) -> None:
    """Adds to `status` the nodes whose package set a distribution advisory's range for their release
    does not hit (advisories.osmatch.not_affected): known_not_affected with its justification
    (component_not_present where no binary of the source package is installed), or
    under_investigation where the advisory has open review items."""
    ids = [a.id for a in advisories]
    if not AffectedRange.objects.filter(advisory_id__in=ids, component=OS_PACKAGE).exists():
        return
    found = osmatch.not_affected(ids)
    nodes = {n.id: n for n in Node.objects.filter(id__in={f.node_id for f in found}).select_related("cluster")}
    for item in found:
        node = nodes[item.node_id]
        pid = f"{node.cluster.name}/{node.name}/{item.package}"
        for cve_id in sorted(item.cve_ids):
            if pid in status[cve_id]:
                continue  # an exposure of the node's package, or another range of it, said it first
            products.setdefault(pid, f"{pid} {item.version or '(not installed)'}")
            if cve_doubt[cve_id]:
                status[cve_id][pid] = ("under_investigation", _Unexposed(
                    "under_investigation", "", f"{item.reason}, but the advisory has open review items: review it"))
            else:
                status[cve_id][pid] = ("known_not_affected", _Unexposed("known_not_affected", item.reason,
                                                                        justification=item.justification))


def _reference(advisory: Advisory) -> dict[str, str]:
    """Where the bulletin is: its URL when it came from one, else NVIDIA's page for its id, or osv.dev's
    page for a distribution's advisory (the aggregator of OSV records)."""
    page = NVIDIA_BULLETIN if advisory.publisher.upper() == "NVIDIA" else OSV_PAGE
    url = advisory.source if advisory.source.startswith(("http://", "https://")) else (
        f"{page}{advisory.publisher_id}")
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
    if scores := _scores(cve, by_product):
        entry["scores"] = scores
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
