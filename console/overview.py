"""The overview page from the sections the apps register (gpusweep.registry), none imported here.

Three lives of a value: ``figures`` (fleet-wide, a second or two on 100,000 nodes) are served up to
GPUSWEEP_CONSOLE_FIGURES_S old, all sections' together under one time (the page says as of when);
``counts`` are exact, kept until a table a section ``reads`` is written (gpusweep.responses.cached);
``live`` values are made on every visit. The rendered block of a section that is not live is kept
under a key of everything it shows but live values (fragment_key).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpusweep import datagen
from gpusweep.registry import OverviewSection, merged


@dataclass(frozen=True)
class Block:
    """A section's block on the page; `kept`: rendered once per fragment_key (not live). Said here,
    not asked in the template, which would call `live` instead of testing it."""

    section: OverviewSection
    kept: bool


Row = tuple[bool, list[Block]]
ByName = dict[str, dict[str, Any]]


def figures(sections: Iterable[OverviewSection], now: dt.datetime) -> dict[str, Any]:
    return merged(section.figures(now) for section in sections if section.figures is not None)


def tables(sections: Iterable[OverviewSection]) -> tuple[str, ...]:
    """The tables the sections' counts read (their models' own names)."""
    return tuple(dict.fromkeys(model._meta.db_table for section in sections for model in section.reads))


def counts(sections: Iterable[OverviewSection], now: dt.datetime) -> tuple[ByName, dt.datetime | None]:
    """Each section's counts by its name, and the first moment one of them changes by itself."""
    values: ByName = {}
    until: dt.datetime | None = None
    for section in sections:
        if section.counts is None:
            continue
        values[section.name], changes = section.counts(now)
        if changes is not None and (until is None or changes < until):
            until = changes
    return values, until


def fragment_key(sections: Iterable[OverviewSection], counts: ByName, computed_at: float,
                 roles: Sequence[str]) -> str:
    """What a kept block depends on: the figures' time, the counts of the sections that are not live,
    the roles and the database (datagen.scope)."""
    kept = [(s.name, counts[s.name]) for s in sections if s.live is None and s.name in counts]
    return hashlib.sha256(repr((datagen.scope(), computed_at, kept, roles)).encode()).hexdigest()


def rows(sections: Iterable[OverviewSection]) -> list[Row]:
    """The sections with a block, as lines of the page: two half sections in a row share one (a grid)."""
    lines: list[Row] = []
    for section in sections:
        if not section.template:
            continue
        block = Block(section, kept=section.live is None)
        if section.half and lines and lines[-1][0] and len(lines[-1][1]) == 1:
            lines[-1][1].append(block)
        else:
            lines.append((section.half, [block]))
    return lines
