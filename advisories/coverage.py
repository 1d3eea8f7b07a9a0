"""How much of a bulletin gpusweep read: its product rows decoded, presumed and under review, and
the nodes each class touches, so that "nothing silent" can be checked at a glance.

One definition (`classify`), whether the bulletin is a parsed document (`of_parsed`: what
`manage.py advisory_coverage` prints) or a stored advisory (`of_advisory`: the API, the console and
the report), so both say the same of a bulletin just ingested.

The entries counted are the document's product rows (every product_version leaf, fixed rows too)
and what it leaves out that gpusweep still accounts for: a gap of driver branches it skips,
branches older than it lists, a product a CVE names outside the tree. Each counts as one row
(`csaf.entry_of` says which entry a range or review item belongs to). An entry is *under review*
while an open review item names it, else *presumed* when a presumed range comes from it, else
*decoded* when its version text decoded (or an admin mapped or dismissed its review item); an
entry in none of them is *silent*, which must never happen (tests/advisories/test_coverage.py
checks every bulletin).

The nodes of a class are those its entries touch: the nodes their ranges expose (a decoded
entry) or presume exposed (a presumed entry); for an entry under review, also every node running
the component its review item names, since a human has yet to say which are affected. Of those,
the line says how many its ranges expose and presume exposed ("2 under review (3 nodes: 1
exposed, 1 presumed exposed)"), so a node presumed exposed through a row under review is never
counted as a presumed row's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from advisories.choices import RangeBasis, ReviewState
from advisories.csaf import entry_of

if TYPE_CHECKING:
    from advisories.csaf import ParsedAdvisory
    from advisories.models import Advisory

CLASSES = ("decoded", "presumed", "review")
LABELS = {"decoded": "decoded", "presumed": "presumed", "review": "under review"}


def _nodes(n: int) -> str:
    return f"{n} node{'s' * (n != 1)}"


@dataclass
class Coverage:
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    nodes: dict[str, int] | None = None  # nodes each class touches (None: no inventory to say)
    # Of the nodes under review, those its entries' ranges expose and presume exposed.
    review_nodes: dict[str, int] | None = None
    silent: list[str] = field(default_factory=list)  # rows in no class, quoted
    classes: dict[str, str] = field(default_factory=dict, repr=False)  # entry -> its class ("" silent)

    def line(self, nodes: bool = True) -> str:
        """'12 rows: 10 decoded (3 nodes), 1 presumed (1 node), 1 under review (2 nodes: 0 exposed,
        1 presumed exposed)'; without the node counts where `nodes` is False or none are known."""
        total = sum(self.rows.values()) + len(self.silent)
        parts = []
        for name in CLASSES:
            touched = ""
            if nodes and self.nodes is not None:
                touched = _nodes(self.nodes[name])
                if name == "review" and self.nodes[name] and self.review_nodes is not None:
                    touched += (f": {self.review_nodes['exposed']} exposed, "
                                f"{self.review_nodes['presumed']} presumed exposed")
                touched = f" ({touched})"
            parts.append(f"{self.rows[name]} {LABELS[name]}{touched}")
        silent = f", {len(self.silent)} SILENT" if self.silent else ""
        return f"{total} row{'s' * (total != 1)}: {', '.join(parts)}{silent}"

    def as_dict(self) -> dict[str, Any]:
        return {"rows": dict(self.rows), "nodes": self.nodes, "review_nodes": self.review_nodes,
                "silent": list(self.silent), "line": self.line()}


def classify(rows: Mapping[str, str], read: Iterable[str], ranges: Iterable[tuple[str, str]],
             reviewed: Iterable[str]) -> Coverage:
    """The coverage of a bulletin's entries (see the module's docstring): `rows` {product_id: version
    text}, `read` the ids whose text decoded (or a human resolved), `ranges` (product_id, basis) of
    its ranges, `reviewed` the keys of its open review items."""
    ranges = list(ranges)
    review = {entry_of(key) for key in reviewed}
    presumed = {entry_of(pid) for pid, basis in ranges if basis in RangeBasis.PRESUMED}
    decoded = {entry_of(pid) for pid in read} | {entry_of(pid) for pid, basis in ranges
                                                  if basis not in RangeBasis.PRESUMED}
    texts: dict[str, str] = {}
    for pid, text in rows.items():
        texts.setdefault(entry_of(pid), text)
    for key in sorted(review | presumed | decoded):
        texts.setdefault(key, key)
    coverage = Coverage()
    for key, text in texts.items():
        name = ("review" if key in review else "presumed" if key in presumed else
                "decoded" if key in decoded else "")
        coverage.classes[key] = name
        if name:
            coverage.rows[name] += 1
        else:
            coverage.silent.append(f"{key}: {text!r}")
    return coverage


def of_parsed(parsed: ParsedAdvisory) -> Coverage:
    """The coverage of a parsed document: what the ingest would store of it, rows only."""
    return classify(parsed.rows, parsed.read_rows, ((r.product_id, r.basis) for r in parsed.ranges),
                    (n.key for n in parsed.review))


def of_advisory(advisory: Advisory) -> Coverage:
    """The coverage of one stored advisory (see `of_advisories`)."""
    return of_advisories([advisory.pk])[advisory.pk]


def of_advisories(ids: list[int]) -> dict[int, Coverage]:
    """The coverage of stored advisories, in five queries whatever their number: the document's rows
    kept at ingest, their ranges and review items (`classify`), then the nodes their exposures and
    the components their open review items name touch. An advisory stored before its rows were kept
    (or known only from an index) counts the entries its ranges and review items name."""
    from django.db.models import Case, CharField, Count, Value, When

    from advisories.models import Advisory, AffectedRange, Exposure, ReviewItem
    from inventory.models import NodeComponent

    stored = {pk: (rows or {}, read or []) for pk, rows, read in Advisory.objects.filter(pk__in=ids).values_list(
        "pk", "product_rows", "read_rows")}
    open_items: dict[int, list[tuple[str, str]]] = {i: [] for i in ids}
    resolved: dict[int, list[str]] = {i: [] for i in ids}
    for advisory_id, key, component, state in ReviewItem.objects.filter(advisory_id__in=ids).values_list(
            "advisory_id", "key", "component", "state"):
        if state == ReviewState.OPEN:
            open_items[advisory_id].append((key, component))
        else:  # mapped or dismissed: a human read the row
            resolved[advisory_id].append(key)
    ranges: dict[int, list[tuple[int, str, str]]] = {i: [] for i in ids}
    for advisory_id, range_id, pid, basis in AffectedRange.objects.filter(advisory_id__in=ids).values_list(
            "advisory_id", "id", "product_id", "basis"):
        ranges[advisory_id].append((range_id, pid, basis))
    out: dict[int, Coverage] = {}
    # Each range counts for its entry's class; a range of an entry under review, by its own basis.
    range_class: dict[int, str] = {}
    for advisory_id in ids:
        rows, read = stored.get(advisory_id, ({}, []))
        coverage = classify(rows, [*read, *resolved[advisory_id]],
                            ((pid, basis) for _i, pid, basis in ranges[advisory_id]),
                            (key for key, _c in open_items[advisory_id]))
        for range_id, pid, basis in ranges[advisory_id]:
            name = coverage.classes.get(entry_of(pid), "decoded")
            range_class[range_id] = (name if name != "review" else
                                     "review_presumed" if basis in RangeBasis.PRESUMED else "review_exposed")
        out[advisory_id] = coverage
    by_class: dict[str, list[int]] = {}
    for range_id, name in range_class.items():
        by_class.setdefault(name, []).append(range_id)
    cls = Case(*(When(affected_range_id__in=members, then=Value(name)) for name, members in by_class.items()),
               default=Value("decoded"), output_field=CharField())
    counts = {(advisory_id, name): n for advisory_id, name, n in Exposure.objects.filter(
        advisory_id__in=ids).annotate(cls=cls).values("advisory_id", "cls").annotate(
        n=Count("node", distinct=True)).values_list("advisory_id", "cls", "n")} if by_class else {}
    under_review = by_class.get("review_presumed", []) + by_class.get("review_exposed", [])
    exposed_in_review: dict[int, set[int]] = {}
    for advisory_id, node_id in Exposure.objects.filter(affected_range_id__in=under_review).values_list(
            "advisory_id", "node_id").distinct() if under_review else []:
        exposed_in_review.setdefault(advisory_id, set()).add(node_id)
    named = {c for found in open_items.values() for _k, c in found if c}
    running: dict[str, set[int]] = {}
    for component, node_id in NodeComponent.objects.filter(component__in=named).values_list("component", "node_id"):
        running.setdefault(component, set()).add(node_id)
    for advisory_id, coverage in out.items():
        touched = exposed_in_review.get(advisory_id, set()).union(
            *(running.get(c, set()) for _k, c in open_items[advisory_id]))
        coverage.nodes = {"decoded": counts.get((advisory_id, "decoded"), 0),
                          "presumed": counts.get((advisory_id, "presumed"), 0),
                          "review": len(touched)}
        coverage.review_nodes = {"exposed": counts.get((advisory_id, "review_exposed"), 0),
                                 "presumed": counts.get((advisory_id, "review_presumed"), 0)}
    return out
