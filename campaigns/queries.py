"""The campaigns app's plain statements outside the engine (``campaigns.engine.queries`` holds the
engine's): the signer's look-up of a chain's stored head, made before every signature it gives
(``evidence.stored_head_at``; compiling it through the ORM cost more CPU than running it).
Names come from the models (gpusweep.db.names); values are parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from campaigns.models import EvidenceEvent
from gpusweep.db.names import Columns

EVENTS = Columns(EvidenceEvent)

# select_rows' conditions for event `seq` of a chain, at most one row each (the chains' numbers are
# unique): of a node sweep's (params campaign, sweep, seq), of the campaign's own (params campaign, seq).
NODE_EVENT = f"{EVENTS.campaign_id} = %s AND {EVENTS.sweep_id} = %s AND {EVENTS.node_seq} = %s"
CAMPAIGN_EVENT = f"{EVENTS.campaign_id} = %s AND {EVENTS.sweep_id} IS NULL AND {EVENTS.seq} = %s"


def examples() -> Iterator[tuple[str, list[Any]]]:
    """Every statement above with parameters of the right shape (tests/foundation/test_sql_statements.py)."""
    yield f"SELECT {EVENTS.hash} FROM {EVENTS} WHERE {NODE_EVENT}", [1, 1, 1]
    yield f"SELECT {EVENTS.hash} FROM {EVENTS} WHERE {CAMPAIGN_EVENT}", [1, 1]
