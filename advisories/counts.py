"""Per advisory: exposed nodes, presumed nodes and open exposures, in one scan of the exposures.

Advisories are few (tens to hundreds) and exposures many (520,000 on 100,000 nodes): the lists
that filter and sort advisories by these counts do it in Python on this one GROUP BY, never with
joins from advisories to exposures, reviews and CVEs at once (their cross product took 30 s).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, Q

from advisories.choices import ExposureState
from advisories.models import Exposure
from gpusweep.pages import cached_figures


@dataclass(frozen=True)
class Counts:
    exposed_nodes: int = 0  # open exposures' distinct nodes
    presumed_nodes: int = 0
    open_exposures: int = 0


def per_advisory() -> dict[int, Counts]:
    rows = Exposure.objects.filter(state__in=[ExposureState.OPEN, ExposureState.PRESUMED]).values(
        "advisory_id").annotate(
        exposed=Count("node", filter=Q(state=ExposureState.OPEN), distinct=True),
        presumed=Count("node", filter=Q(state=ExposureState.PRESUMED), distinct=True),
        n=Count("id", filter=Q(state=ExposureState.OPEN)),
    ).values_list("advisory_id", "exposed", "presumed", "n")
    return {advisory: Counts(exposed, presumed, n) for advisory, exposed, presumed, n in rows}


def cached() -> dict[int, Counts]:
    """per_advisory(), from the cache when fresh enough (GPUSWEEP_CONSOLE_FIGURES_S)."""
    return cached_figures("console:advisory-counts", per_advisory, settings.GPUSWEEP_CONSOLE_FIGURES_S)[0]
