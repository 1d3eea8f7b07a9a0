"""The console's cached figures: computed once, served while fresh, refreshed in the background."""

from __future__ import annotations

import threading
import time

from django.core.cache import cache

from gpusweep.pages import cached_figures


def test_a_stale_value_is_served_while_one_thread_computes_the_next():
    cache.clear()
    calls: list[int] = []
    release = threading.Event()

    def compute() -> int:
        calls.append(1)
        if len(calls) > 1:
            release.wait(5)
        return len(calls)

    assert cached_figures("t", compute, 60)[0] == 1
    assert cached_figures("t", compute, 60)[0] == 1 and len(calls) == 1  # fresh: from the cache
    cache.set("t", (time.time() - 120, 1), 600)  # now stale
    started = time.monotonic()
    assert cached_figures("t", compute, 60)[0] == 1  # the stale value, at once
    assert cached_figures("t", compute, 60)[0] == 1  # still computing: no second computation
    assert time.monotonic() - started < 1
    release.set()
    deadline = time.monotonic() + 5
    while cache.get("t")[1] != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cached_figures("t", compute, 60)[0] == 2 and len(calls) == 2
    assert cached_figures("t", compute, 0)[0] == 3  # no caching at all
    cache.clear()
