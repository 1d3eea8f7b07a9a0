"""Connects the webhooks app to the signals it listens to; each handler is in events.py."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import receiver

from advisories.signals import advisories_matched
from campaigns.signals import evidence_recorded
from webhooks import events

log = logging.getLogger(__name__)


@receiver(evidence_recorded, dispatch_uid="webhooks.on_evidence")
def on_evidence(sender: Any, **fields: Any) -> None:
    # After the campaign's own transaction committed: a failure here must not fail the campaign.
    try:
        events.on_evidence(fields["campaign_id"], fields["sweep_id"], fields["kind"], fields["seq"], fields["hash"],
                           fields["actor"], fields["at"], fields["data"])
    except Exception:  # logged: the beat's scans and replays cover a missed event
        log.exception("webhooks: could not emit for evidence %s", fields.get("hash"))


@receiver(advisories_matched, dispatch_uid="webhooks.on_advisories_matched")
def on_advisories_matched(sender: Any, advisory_ids: list[int], **kwargs: Any) -> None:
    try:
        events.on_advisories_matched(advisory_ids)
    except Exception:  # logged, as above
        log.exception("webhooks: could not emit for advisories %s", advisory_ids)
