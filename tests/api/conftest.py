from __future__ import annotations

import pytest


@pytest.fixture
def seeded(db):  # type: ignore[no-untyped-def]
    """tests/api/seed.py's database: a fleet, the bundled bulletins' exposures, campaigns in each state."""
    from campaigns import queue
    from tests.api.seed import seed

    queue.ENQUEUE.insert(0, lambda *args: None)  # seed() starts a campaign: no broker here
    try:
        return seed()
    finally:
        queue.ENQUEUE.pop(0)
