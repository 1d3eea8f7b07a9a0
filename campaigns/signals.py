"""Signals other apps listen to (webhooks); campaigns itself never imports a listener.

``evidence_recorded`` is sent once the transaction that wrote an evidence event commits (never for
one rolled back), in commit order, with ``campaign_id``, ``sweep_id`` (None for a campaign-level
event), ``kind``, ``seq`` (its number in its chain), ``hash``, ``actor``, ``at`` and ``data``.
A prepared node event whose conditional UPDATE lost its race is not saved but its transaction may
still commit: a listener that needs the row checks it exists by ``hash``.
"""

from __future__ import annotations

import django.dispatch

evidence_recorded = django.dispatch.Signal()
