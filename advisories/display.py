"""Advisory data in words for people: affected ranges, deadlines, hashes.

A range reads "R570 (Linux, Tesla): below 570.195.03, fixed in 570.195.03"; the publisher's
product ids (``570_172_07all_versions_prior_to_...``) stay in the API and the exports.
"""

from __future__ import annotations

from advisories import components
from advisories.choices import RangeBasis
from advisories.models import AffectedRange

OS_LABELS = {"linux": "Linux", "windows": "Windows", "hypervisor": "Hypervisor", "": ""}


def _bound(version: str) -> str:
    # A bare number is a branch floor or ceiling ("540" for "above R535"), not a release.
    return f"branch R{version}" if version and "." not in version else version


def range_text(r: AffectedRange) -> str:
    component = components.by_name(r.component)
    where = ", ".join(p for p in (OS_LABELS.get(r.os_family, r.os_family), r.product_name) if p)
    head = r.branch or (component.label if component else r.component.replace("_", " "))
    if r.branch and r.component != "driver":
        head = f"{component.label if component else r.component} {r.branch}"
    parts = []
    lower = r.lower_version
    if lower and lower != r.branch.lstrip("R"):  # a branch's own floor says nothing
        parts.append(f"from {_bound(lower)}" + ("" if r.lower_inclusive else " (exclusive)"))
    if r.upper_version:
        parts.append(f"{'up to and including' if r.upper_inclusive else 'below'} {_bound(r.upper_version)}")
    if not parts:
        parts.append("all versions")
    text = f"{head} ({where}): " if where else f"{head}: "
    text += " ".join(parts)
    text += f", fixed in {r.fixed_version}" if r.fixed_version else ", no fixed version"
    scope = ", ".join(str(v) for v in (r.scope or {}).values())
    if scope:
        text += f"; only {scope}"
    for fact, values in (r.condition or {}).items():
        shown = "/".join(values) if isinstance(values, list) else str(values)
        text += f"; only where {fact.replace('_', ' ')} is {shown}"
    if r.basis == RangeBasis.UNSUPPORTED_BRANCH:
        text += " (the bulletin skips these branches: nodes on them are presumed exposed)"
    elif r.basis == RangeBasis.UNDECODED:
        text += " (the row could not be decoded: nodes running the product are presumed exposed)"
    return text
