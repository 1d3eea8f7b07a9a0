"""Sections an app contributes to a page that another part of the console renders.

The overview, the settings page and a node's page show what several apps own. The page that
renders them imports none of those apps: each app adds its sections here in its
``AppConfig.ready()`` (as each app's ``api.py`` contributes its router to gpusweep.api), and the
page renders what is registered, in ``order``. An app that is not installed shows nothing.

Context from every section of a page is merged into the page's one template context, so two
sections of a page never use the same name (``merged`` refuses it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model


class Named(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def order(self) -> int: ...


S = TypeVar("S", bound=Named)

Counts = tuple[dict[str, Any], dt.datetime | None]


@dataclass(frozen=True)
class OverviewSection:
    """A part of the overview page.

    ``figures(now)``: fleet-wide values, computed together with every section's and served up to
    GPUSWEEP_CONSOLE_FIGURES_S old. ``counts(now)``: exact values and the moment they next change
    by themselves (None: not before a write), kept until one of the tables of ``reads`` is written.
    ``live(counts)``: values made on every visit from this section's counts; a live section's
    block is never kept as a rendered fragment. ``headline``: a template of a piece of the page's
    first line; ``template``: the section's block ("" for none); two ``half`` sections in a row
    share a line of two columns.
    """

    name: str
    order: int
    template: str = ""
    headline: str = ""
    figures: Callable[[dt.datetime], dict[str, Any]] | None = None
    counts: Callable[[dt.datetime], Counts] | None = None
    reads: tuple[type[Model], ...] = ()
    live: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    half: bool = False


@dataclass(frozen=True)
class PageSection:
    """A block of a page: ``template`` rendered with ``context``'s values.

    On the settings page ``context(request)`` may answer the request itself (a redirect after its
    form is saved) by returning an HttpResponse; on a node's page it is ``context(request, node)``.
    """

    name: str
    order: int
    template: str
    context: Callable[..., Any]


@dataclass(frozen=True)
class Link:
    """A link to a page of an app, shown where it leads somewhere (gpusweep.pages.installed)."""

    name: str
    order: int
    path: str


class Sections(Generic[S]):
    """Registered sections, by name (registering again replaces: ready() may run more than once)."""

    def __init__(self) -> None:
        self._by_name: dict[str, S] = {}

    def add(self, *sections: S) -> None:
        for section in sections:
            self._by_name[section.name] = section

    def __iter__(self) -> Iterator[S]:
        return iter(sorted(self._by_name.values(), key=lambda s: (s.order, s.name)))


overview: Sections[OverviewSection] = Sections()
settings_page: Sections[PageSection] = Sections()
settings_links: Sections[Link] = Sections()
node_page: Sections[PageSection] = Sections()


def merged(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One template context from the sections' values; a name given twice is a bug, not an override."""
    context: dict[str, Any] = {}
    for part in parts:
        clash = context.keys() & part.keys()
        if clash:
            raise ImproperlyConfigured(f"two sections of a page give {', '.join(sorted(clash))}")
        context.update(part)
    return context


# The executors a cluster's `connection.executor` may name (executors' ready() registers its
# ALIASES): the inventory API and admin check a name against it without importing the executors app,
# and nothing a user writes is ever imported as a dotted path (issue 28 item 5).
executor_names: set[str] = set()


def executor_problem(name: object) -> str:
    """What is wrong with `name` as a cluster's executor ("" when it is a registered one)."""
    if isinstance(name, str) and name in executor_names:
        return ""
    return f"executor {name!r} is not one of the registered executors: {', '.join(sorted(executor_names))}"
