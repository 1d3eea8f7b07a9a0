"""How much of a bulletin gpusweep read: its product rows decoded, presumed and under review, and
the nodes each class touches, so that "nothing silent" can be checked at a glance.

A row (a product_version leaf) is *under review* when a review item names it, else *presumed*
when a presumed range comes from it, else *decoded* when its version text decoded; a row in none
of them is *silent*, which must never happen (tests/advisories/test_coverage.py checks every
bulletin). From a parsed document (`of_parsed`, no database) or a stored advisory (`of_advisory`:
its ranges, open review items and exposures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from advisories.choices import RangeBasis, ReviewState

if TYPE_CHECKING:
    from advisories.csaf import ParsedAdvisory
    from advisories.models import Advisory

CLASSES = ("decoded", "presumed", "review")


@dataclass
class Coverage:
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    nodes: dict[str, int] | None = None  # nodes each class touches (None: no inventory to say)
    silent: list[str] = field(default_factory=list)  # rows in no class, quoted

    def line(self) -> str:
        """'12 rows: 10 decoded (3 nodes), 1 presumed (1 node), 1 under review (0 nodes)'."""
        total = sum(self.rows.values()) + len(self.silent)
        parts = []
        for name, label in zip(CLASSES, ("decoded", "presumed", "under review"), strict=True):
            touched = "" if self.nodes is None else f" ({self.nodes[name]} node{'s' * (self.nodes[name] != 1)})"
            parts.append(f"{self.rows[name]} {label}{touched}")
        silent = f", {len(self.silent)} SILENT" if self.silent else ""
        return f"{total} row{'s' * (total != 1)}: {', '.join(parts)}{silent}"

    def as_dict(self) -> dict[str, Any]:
        return {"rows": dict(self.rows), "nodes": self.nodes, "silent": list(self.silent), "line": self.line()}


def _base(product_id: str) -> str:
    """A range's row: 'pid#1' (a second interval) and 'pid#earlier' are the row 'pid'."""
    return product_id.split("#", 1)[0]


def of_parsed(parsed: ParsedAdvisory) -> Coverage:
    reviewed = {_base(n.key) for n in parsed.review}
    presumed = {_base(r.product_id) for r in parsed.ranges if r.basis in RangeBasis.PRESUMED}
    coverage = Coverage()
    for pid, text in parsed.rows.items():
        name = ("review" if pid in reviewed else "presumed" if pid in presumed else
                "decoded" if pid in parsed.read_rows else "")
        if name:
            coverage.rows[name] += 1
        else:
            coverage.silent.append(f"{pid}: {text!r}")
    return coverage


def of_advisory(advisory: Advisory) -> Coverage:
    """The coverage of one stored advisory (see `of_advisories`)."""
    return of_advisories([advisory.pk])[advisory.pk]


def of_advisories(ids: list[int]) -> dict[int, Coverage]:
    """The coverage of stored advisories, in four queries whatever their number: rows from their
    ranges (the affected rows; fixed rows are not stored apart) and open review items, nodes from
    their exposures and from the inventory's components their open items name."""
    from django.db.models import Case, Count, Value, When

    from advisories.models import AffectedRange, Exposure, ReviewItem
    from inventory.models import NodeComponent

    items: dict[int, list[tuple[str, str]]] = {i: [] for i in ids}
    for advisory_id, key, component in ReviewItem.objects.filter(
            advisory_id__in=ids, state=ReviewState.OPEN).values_list("advisory_id", "key", "component"):
        items[advisory_id].append((key, component))
    rows: dict[int, dict[str, str]] = {i: {} for i in ids}
    for advisory_id, pid, basis in AffectedRange.objects.filter(advisory_id__in=ids).values_list(
            "advisory_id", "product_id", "basis"):
        if basis in RangeBasis.PRESUMED or _base(pid) not in rows[advisory_id]:
            rows[advisory_id][_base(pid)] = "presumed" if basis in RangeBasis.PRESUMED else "decoded"
    presumed = Case(When(affected_range__basis__in=list(RangeBasis.PRESUMED), then=Value("presumed")),
                    default=Value("decoded"))
    nodes = {(advisory_id, name): n for advisory_id, name, n in Exposure.objects.filter(
        advisory_id__in=ids).annotate(cls=presumed).values("advisory_id", "cls").annotate(
        n=Count("node", distinct=True)).values_list("advisory_id", "cls", "n")}
    named = {c for found in items.values() for _k, c in found if c}
    running: dict[str, set[int]] = {}
    for component, node_id in NodeComponent.objects.filter(component__in=named).values_list("component", "node_id"):
        running.setdefault(component, set()).add(node_id)
    out: dict[int, Coverage] = {}
    for advisory_id in ids:
        reviewed = {_base(key) for key, _c in items[advisory_id]}
        coverage = Coverage()
        for pid, name in rows[advisory_id].items():
            coverage.rows["review" if pid in reviewed else name] += 1
        coverage.rows["review"] += len(reviewed - set(rows[advisory_id]))
        coverage.nodes = {"decoded": nodes.get((advisory_id, "decoded"), 0),
                          "presumed": nodes.get((advisory_id, "presumed"), 0),
                          "review": len(set().union(*(running.get(c, set()) for _k, c in items[advisory_id])))}
        out[advisory_id] = coverage
    return out
