"""Decisions people make about advisories and exposures, each with its evidence.

Approvers accept a risk until an expiry, revoke it, or set an exposure `not_affected` with a
CSAF/VEX justification; admins resolve an advisory's review items by mapping one to a range or
dismissing it with a reason. Every function checks the state it expects with a conditional
UPDATE (two people deciding at once end in one defined state), and writes an AdvisoryEvent naming
the user, what was decided and what it changed, in the same transaction. The API and the pages
call these, nothing else writes these fields.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.auth.models import User as AuthUser
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from advisories import components
from advisories.choices import DeadlineBasis, EventKind, ExposureState, RangeBasis, ReviewState, VexJustification
from advisories.exposure import recompute
from advisories.ingest import mapped_range, withdraw_presumed
from advisories.models import AdvisoryEvent, AffectedRange, DeadlinePolicy, Exposure, ReviewItem
from advisories.osv import OS_PACKAGE
from advisories.tasks import refresh_deadlines
from inventory.choices import ChangeSource
from inventory.versions import VersionError, parse_version

User = AbstractBaseUser | AnonymousUser


def _who(user: User) -> AuthUser | None:
    return user if isinstance(user, AuthUser) else None


class DecisionError(ValueError):
    """A decision that does not apply (wrong state, bad mapping); nothing was changed."""

    def __init__(self, message: str, conflict: bool = False) -> None:
        super().__init__(message)
        self.conflict = conflict  # the object is in another state (HTTP 409) rather than the input bad (400)


def _event(exposure: Exposure, kind: str, user: User, message: str, **details: Any) -> None:
    AdvisoryEvent.objects.create(
        advisory_id=exposure.advisory_id, kind=kind, user=_who(user),
        message=message, details={"exposure": exposure.pk, "node": exposure.node.name,
                                  "cluster": exposure.node.cluster.name, **details})


def _decide(exposure_id: int, allowed: frozenset[str], what: str, **values: Any) -> Exposure:
    exposure = Exposure.objects.select_related("node__cluster").get(pk=exposure_id)
    updated = Exposure.objects.filter(pk=exposure_id, state__in=allowed).update(updated_at=timezone.now(), **values)
    if not updated:
        raise DecisionError(f"exposure {exposure_id} is {exposure.state}; {what}", conflict=True)
    return exposure


@transaction.atomic
def accept_risk(exposure_id: int, user: User, reason: str, expires_at: dt.datetime) -> Exposure:
    """An approver accepts the risk until `expires_at`; the exposure stays listed and counted."""
    if expires_at <= timezone.now():
        raise DecisionError("expiry must be in the future")
    longest = DeadlinePolicy.current().risk_max_days
    if expires_at > timezone.now() + dt.timedelta(days=longest):
        raise DecisionError(f"a risk may be accepted for at most {longest} days (the policy's risk_max_days)")
    before = _decide(exposure_id, frozenset({ExposureState.OPEN, ExposureState.PRESUMED, ExposureState.RISK_ACCEPTED}),
                     "only open or presumed exposures can be accepted", state=ExposureState.RISK_ACCEPTED,
                     risk_approver=_who(user), risk_reason=reason, risk_expires_at=expires_at, justification="")
    _event(before, EventKind.RISK_ACCEPTED, user, f"risk accepted until {expires_at:%Y-%m-%d}: {reason}",
           previous=before.state, expires_at=expires_at.isoformat())
    return Exposure.objects.get(pk=exposure_id)


@transaction.atomic
def accept_risks(exposure_ids: list[int], user: User, reason: str, expires_at: dt.datetime) -> list[Exposure]:
    """Accept several risks at once (the exposure list's bulk action): all of them, or none."""
    return [accept_risk(pk, user, reason, expires_at) for pk in sorted(set(exposure_ids))]


@transaction.atomic
def revoke_risk(exposure_id: int, user: User) -> Exposure:
    """The exposure is exposed again: presumed where the bulletin does not tell, else open."""
    basis = Exposure.objects.filter(pk=exposure_id).values_list("affected_range__basis", flat=True).first()
    before = _decide(exposure_id, frozenset({ExposureState.RISK_ACCEPTED}), "only an accepted risk can be revoked",
                     state=ExposureState.PRESUMED if basis in RangeBasis.PRESUMED else ExposureState.OPEN)
    _event(before, EventKind.RISK_REVOKED, user, "risk acceptance revoked", previous=before.state)
    return Exposure.objects.get(pk=exposure_id)


@transaction.atomic
def mark_not_affected(exposure_id: int, user: User, justification: str, reason: str) -> Exposure:
    """An approver says the node is not affected after all, with a CSAF/VEX justification.

    Meant for `presumed` exposures (the bulletin did not tell), and allowed for open ones (the
    vulnerable code is not in this node's execute path, say). A later inventory change that
    takes the node out of the range remediates it as usual.
    """
    if justification not in VexJustification.values():
        raise DecisionError(f"justification must be one of {', '.join(VexJustification.values())}")
    before = _decide(exposure_id, frozenset({ExposureState.OPEN, ExposureState.PRESUMED, ExposureState.RISK_ACCEPTED}),
                     "only open or presumed exposures can be set not affected", state=ExposureState.NOT_AFFECTED,
                     risk_approver=_who(user), risk_reason=reason, risk_expires_at=None, justification=justification)
    _event(before, EventKind.NOT_AFFECTED, user, f"not affected ({justification}): {reason}", previous=before.state,
           justification=justification)
    return Exposure.objects.get(pk=exposure_id)


# --- the deadline policy ----------------------------------------------------------------------

POLICY_FIELDS = ("critical_days", "high_days", "medium_days", "low_days", "basis", "use_kev")


@transaction.atomic
def set_deadline_policy(user: User, values: dict[str, Any]) -> DeadlinePolicy:
    """An admin changes the days per severity (or the basis), recorded with who made it; every
    active deadline is then recomputed by a task (`deadlines_changed`), so the page answers at once."""
    unknown = set(values) - set(POLICY_FIELDS)
    if unknown:
        raise DecisionError(f"unknown deadline policy fields {sorted(unknown)}")
    for name in POLICY_FIELDS[:4]:
        if name in values and not (isinstance(values[name], int) and 1 <= values[name] <= 3650):
            raise DecisionError(f"{name}: a whole number of days between 1 and 3650")
    if "basis" in values and values["basis"] not in DeadlineBasis.values():
        raise DecisionError(f"basis must be one of {', '.join(DeadlineBasis.values())}")
    policy = DeadlinePolicy.objects.select_for_update().get(pk=DeadlinePolicy.current().pk)
    changes = {k: [getattr(policy, k), v] for k, v in values.items() if getattr(policy, k) != v}
    if not changes:
        return policy
    for name, (_before, after) in changes.items():
        setattr(policy, name, after)
    policy.save()
    generation = deadlines_changed()
    AdvisoryEvent.objects.create(kind=EventKind.POLICY_CHANGED, user=_who(user), message=str(policy),
                                 details={"changes": changes, "generation": generation})
    return policy


# --- review items ------------------------------------------------------------------------------

MAPPING_KEYS = {"component", "os_family", "branch", "product_line", "lower", "lower_inclusive", "upper",
                "upper_inclusive", "fixed_version", "scope", "condition"}


def validate_mapping(mapping: dict[str, Any]) -> dict[str, Any]:
    """A range an admin describes: a registered component and versions that compare."""
    unknown = set(mapping) - MAPPING_KEYS
    if unknown:
        raise DecisionError(f"unknown mapping keys {sorted(unknown)} (allowed: {sorted(MAPPING_KEYS)})")
    component = str(mapping.get("component", ""))
    if components.by_name(component) is None:
        raise DecisionError(f"component must be one of {', '.join(c.name for c in components.REGISTRY)}")
    if not mapping.get("upper") and not mapping.get("fixed_version"):
        raise DecisionError("a mapping needs an upper bound or a fixed version (else nothing ever fixes it)")
    for key in ("lower", "upper", "fixed_version"):
        value = mapping.get(key)
        if value:
            try:
                if parse_version(component, str(value)).flagged:
                    raise DecisionError(f"{key} {value!r} is not a comparable {component} version")
            except VersionError as exc:
                raise DecisionError(f"{key}: {exc}") from None
    for key in ("scope", "condition"):
        if not isinstance(mapping.get(key, {}), dict):
            raise DecisionError(f"{key} must be an object")
    clean = {k: v for k, v in mapping.items() if v not in (None, "")}
    if not clean.get("upper"):
        clean["upper"], clean["upper_inclusive"] = clean["fixed_version"], False
    return clean


@transaction.atomic
def map_review_item(item_id: int, user: User, mapping: dict[str, Any], reason: str) -> ReviewItem:
    """Resolve an item by saying which range the row means; exposures follow at once.

    The mapped range replaces what the parser made of the row (its presumed exposures are
    withdrawn) and is kept through later revisions of the document.
    """
    clean = validate_mapping(mapping)
    item = ReviewItem.objects.select_related("advisory").get(pk=item_id)
    if not ReviewItem.objects.filter(pk=item_id, state=ReviewState.OPEN).update(
            state=ReviewState.MAPPED, mapping=clean, resolution=reason, resolved_by=_who(user),
            resolved_at=timezone.now()):
        raise DecisionError(f"review item {item_id} is {item.state}", conflict=True)
    advisory = item.advisory
    previous = list(advisory.ranges.filter(product_id=item.key))
    template = previous[0] if previous else None
    rng, lower_key, upper_key = mapped_range(item.key, clean, None)
    presumed = [r.id for r in previous if r.basis in RangeBasis.PRESUMED]
    withdraw_presumed(advisory, presumed, f"review item {item.key} mapped", user)
    others = advisory.ranges.filter(product_id=item.key)
    (others.exclude(pk=template.pk) if template else others).delete()
    values = {
        "product_name": (template.product_name if template else item.raw)[:200],
        "architecture": template.architecture if template else "", "component": rng.component,
        "os_family": rng.os_family, "branch": rng.branch, "product_line": rng.product_line,
        "raw": (template.raw if template else item.raw)[:300], "lower_version": rng.lower or "",
        "lower_key": lower_key, "lower_inclusive": rng.lower_inclusive, "upper_version": rng.upper or "",
        "upper_key": upper_key, "upper_inclusive": rng.upper_inclusive, "fixed_version": rng.fixed_version[:64],
        "basis": RangeBasis.MAPPED, "scope": rng.scope, "condition": rng.condition, "remediation": rng.remediation,
        "severity": template.severity if template else advisory.severity,
    }
    if template:
        AffectedRange.objects.filter(pk=template.pk).update(**values)
    else:
        created = AffectedRange.objects.create(advisory=advisory, product_id=item.key, **values)
        created.cves.set(advisory.cves.all())
    AdvisoryEvent.objects.create(
        advisory=advisory, kind=EventKind.REVIEW_MAPPED, user=_who(user),
        message=f"{item.key} mapped to {rng.component} {rng.lower or ''}..{rng.upper or ''} "
        f"(fixed {rng.fixed_version or '?'}): {reason}",
        details={"item": item.pk, "key": item.key, "mapping": clean})
    recompute(advisory_ids=[advisory.pk])
    return ReviewItem.objects.get(pk=item_id)


@transaction.atomic
def dismiss_review_item(item_id: int, user: User, reason: str) -> ReviewItem:
    """Resolve an item as needing nothing (a product this fleet never runs, a typo NVIDIA fixed).

    Exposures are not changed: a presumed node stays presumed until an approver decides on it.
    """
    item = ReviewItem.objects.select_related("advisory").get(pk=item_id)
    if not ReviewItem.objects.filter(pk=item_id, state=ReviewState.OPEN).update(
            state=ReviewState.DISMISSED, resolution=reason, resolved_by=_who(user), resolved_at=timezone.now()):
        raise DecisionError(f"review item {item_id} is {item.state}", conflict=True)
    AdvisoryEvent.objects.create(advisory=item.advisory, kind=EventKind.REVIEW_DISMISSED,
                                 user=_who(user),
                                 message=f"{item.key} dismissed: {reason}", details={"item": item.pk, "key": item.key})
    return ReviewItem.objects.get(pk=item_id)


def deadlines_changed() -> int:
    """The deadline policy or an override changed (in the caller's transaction): raise the policy's
    generation, and once that commits a task recomputes every deadline. The request answers at once;
    the policy reads `recomputing` until the task is done. Returns the new generation."""
    with transaction.atomic(savepoint=False):
        DeadlinePolicy.current()
        DeadlinePolicy.objects.filter(pk=1).update(generation=F("generation") + 1)
        generation = DeadlinePolicy.objects.values_list("generation", flat=True).get(pk=1)
        # The queue read at call time, as campaigns.queue does (a deployment sharing a broker keeps its own).
        transaction.on_commit(lambda: refresh_deadlines.apply_async(
            args=(generation,), queue=settings.CELERY_TASK_DEFAULT_QUEUE))
    return generation


def credit_sweep(node_id: int, since: dt.datetime, components: Iterable[str], reference: str,
                 advisory_ids: Iterable[int] = ()) -> int:
    """Exposures of the node that its agent's report remediated after a campaign's patch step began
    (`since`), of the components it patched or OS package exposures of its advisories: that report
    came first, but the campaign caused it, so they are credited to it (`reference`). A remediation
    the agent reported before the patch step (a livepatch its service applied by itself) stays the agent's."""
    return Exposure.objects.filter(
        Q(component__in=list(components)) | Q(component=OS_PACKAGE, advisory_id__in=list(advisory_ids)),
        node_id=node_id, state=ExposureState.REMEDIATED, remediated_by=ChangeSource.AGENT,
        remediated_at__gte=since,
    ).update(remediated_by=reference[:200], updated_at=timezone.now())


def move_exposures(node_ids: list[int], cluster_id: int) -> int:
    """The nodes moved to `cluster_id` (inventory.services.move_node, in its transaction): their
    exposures' copy of the cluster follows. Returns the rows changed."""
    with transaction.atomic():
        moved = Exposure.objects.filter(node_id__in=node_ids).exclude(cluster_id=cluster_id)
        return moved.update(cluster_id=cluster_id)
