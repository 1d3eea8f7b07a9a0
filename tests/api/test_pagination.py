"""The large lists (issue 33): keyset pages with `cursor` (every row once, in order, ties in the sort
key included), counts kept per data generation and right after every write, and the lists' rows
built from narrow reads equal to what their serializers render."""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from advisories.api import ExposureSerializer
from advisories.choices import ExposureState
from advisories.models import Exposure
from inventory.api import NodeSerializer
from inventory.models import Node

pytestmark = pytest.mark.django_db

EXPOSURES = "/api/v1/advisories/exposures/"
NODES = "/api/v1/inventory/nodes/"


@pytest.fixture
def client(seeded):  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(seeded.admin)
    return client


def _get(client: Client, url: str, **params: str) -> dict[str, Any]:
    response = client.get(url, params, HTTP_ACCEPT="application/json")
    assert response.status_code == 200, response.content
    return dict(response.json())


def _walk(client: Client, url: str, **params: str) -> tuple[list[dict[str, Any]], int]:
    """Every row by following `next` from `cursor=` (the first page); and the pages read."""
    page = _get(client, url, cursor="", **params)
    rows, pages = list(page["results"]), 1
    while page["next"]:
        assert page["previous"] is None and "offset=" not in page["next"]
        response = client.get(page["next"], HTTP_ACCEPT="application/json")
        assert response.status_code == 200, response.content
        page = response.json()
        rows += page["results"]
        pages += 1
    return rows, pages


def _with_ties() -> None:
    """Deadlines shared by several exposures, and some with none: ties and NULLs in the sort key."""
    ids = list(Exposure.objects.order_by("pk").values_list("pk", flat=True))
    assert len(ids) >= 8, "the seeded database has exposures to page"
    same = timezone.now().replace(microsecond=0) + dt.timedelta(days=3)
    for index, pk in enumerate(ids):
        deadline = None if index % 5 == 0 else same + dt.timedelta(days=index % 3)
        Exposure.objects.filter(pk=pk).update(deadline=deadline)


@pytest.mark.parametrize("ordering", ["", "-deadline", "deadline", "severity,-deadline", "-node__name", "state"])
def test_cursor_pages_give_every_row_once_in_order_with_ties(client, ordering):
    _with_ties()
    params = {"ordering": ordering} if ordering else {}
    everything = _get(client, EXPOSURES, limit="1000", **params)
    rows, pages = _walk(client, EXPOSURES, limit="3", **params)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == everything["count"] == len(everything["results"])
    assert set(ids) == {r["id"] for r in everything["results"]}
    assert pages == -(-len(ids) // 3)
    # In the order asked for (NULLs last going up, first going down), ties split by id the way
    # of the last term: the same rows sorted here.
    terms = (ordering or "deadline,node").split(",")
    expected = sorted(everything["results"], key=lambda r: r["id"], reverse=terms[-1].startswith("-"))
    for term in reversed(terms):
        name = {"node__name": "node_name"}.get(term.lstrip("-"), term.lstrip("-"))
        expected.sort(key=lambda r, n=name: (r[n] is None, r[n]), reverse=term.startswith("-"))
    assert ids == [r["id"] for r in expected]
    if ordering == "-deadline":  # the tie break goes the way of the last term
        tied = [r["id"] for r in rows if r["deadline"] == rows[-1]["deadline"]]
        assert tied == sorted(tied, reverse=True) and len(tied) > 1


def test_nodes_page_by_cursor_too(client, seeded):
    rows, _pages = _walk(client, NODES, limit="2")
    offset_rows = _get(client, NODES, limit="1000")["results"]
    assert [r["id"] for r in rows] == [r["id"] for r in offset_rows]  # (cluster, name) is unique: one order


def test_a_foreign_or_stale_cursor_is_refused(client):
    first = _get(client, EXPOSURES, cursor="", limit="1", ordering="deadline")
    token = parse_qs(urlsplit(first["next"]).query)["cursor"][0]
    assert client.get(EXPOSURES, {"cursor": token + "x"}).status_code == 400
    other = client.get(EXPOSURES, {"cursor": token, "ordering": "-deadline"})
    assert other.status_code == 400 and "ordering" in other.json()["errors"]["cursor"][0]
    both = client.get(EXPOSURES, {"cursor": "", "offset": "3"})
    assert both.status_code == 400 and "offset" in both.json()["errors"]


def test_offset_pages_stay_as_they_were(client):
    page = _get(client, EXPOSURES, limit="2", offset="2")
    assert "offset=4" in page["next"] and "cursor" not in page["next"]
    assert page["previous"] is not None and "cursor" not in page["previous"]


def test_list_rows_are_what_the_serializers_render(client, seeded):
    """The narrow rows (gpusweep.narrow) against DRF's serializers, on every seeded row."""
    Exposure.objects.filter(pk=Exposure.objects.order_by("pk").values_list("pk", flat=True)[1]).update(
        deadline=timezone.now() - dt.timedelta(days=1), state=ExposureState.OPEN)  # one overdue
    nodes = _get(client, NODES, limit="1000")["results"]
    expected = NodeSerializer(Node.objects.filter(pk__in=[n["id"] for n in nodes]).prefetch_related("components"),
                              many=True).data
    assert sorted(nodes, key=lambda n: n["id"]) == sorted((dict(n) for n in expected), key=lambda n: n["id"])
    for params in ({}, {"joined": "false"}):
        rows = _get(client, EXPOSURES, limit="1000", **params)["results"]
        assert rows and any(r["overdue"] for r in rows) and any(r["risk_approver"] for r in rows)
        queryset = Exposure.objects.filter(pk__in=[r["id"] for r in rows]).select_related(
            "node__cluster", "advisory", "affected_range", "risk_approver")
        rendered = ExposureSerializer(list(queryset), many=True).data
        assert sorted(rows, key=lambda r: r["id"]) == sorted((dict(r) for r in rendered), key=lambda r: r["id"])


# Counts are kept under generations raised on commit: these tests commit (transaction=True), with
# no shared cache (the default deployment: GPUSWEEP_CACHE_URL unset).


@pytest.fixture
def small_fleet(admin_user):  # type: ignore[no-untyped-def]
    from advisories.models import CVE, Advisory, AffectedRange
    from inventory.models import Cluster, NodeComponent

    cluster = Cluster.objects.create(name="c1", kind="static")
    nodes = [Node.objects.create(cluster=cluster, name=f"gpu{i:02}") for i in range(6)]
    for node in nodes:
        NodeComponent.objects.create(node=node, component="driver", version="570.86.15", branch="R570")
    advisory = Advisory.objects.create(publisher_id="5703", title="GPU Display Driver", source_kind="file",
                                       source="5703.json")
    rng = AffectedRange.objects.create(advisory=advisory, product_id="linuxR570", component="driver",
                                       branch="R570", raw="prior to 570.195.03", fixed_version="570.195.03")
    rng.cves.add(CVE.objects.create(cve_id="CVE-2025-0001"))
    same = timezone.now().replace(microsecond=0) + dt.timedelta(days=2)
    for node in nodes:  # one deadline for all: every row tied in the sort key
        Exposure.objects.create(node=node, advisory=advisory, affected_range=rng, component="driver",
                                detected_version="570.86.15", first_seen=same, deadline=same)
    client = Client()
    client.force_login(admin_user)
    return client


def _counted(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]


@pytest.mark.django_db(transaction=True)
def test_counts_follow_every_write_and_are_not_recounted_without_one(small_fleet):
    client, params = small_fleet, {"state": "open", "limit": "1"}
    assert not datagen_enabled()
    before = _get(client, EXPOSURES, **params)["count"]
    assert before == 6
    with CaptureQueriesContext(connection) as queries:
        assert _get(client, EXPOSURES, **params)["count"] == before
        assert _get(client, EXPOSURES, **params, ordering="-deadline", cursor="")["count"] == before
    assert not _counted(queries)
    one = Exposure.objects.order_by("pk").first()
    assert one is not None
    Exposure.objects.filter(pk=one.pk).update(state=ExposureState.REMEDIATED)
    assert _get(client, EXPOSURES, **params)["count"] == before - 1
    assert _get(client, NODES, limit="1")["count"] == 6
    Node.objects.filter(pk=Node.objects.order_by("-pk").values_list("pk", flat=True)[0]).delete()
    assert _get(client, NODES, limit="1")["count"] == 5
    with connection.cursor() as cursor:  # a write no ORM saw (psql, another process) counts too
        cursor.execute("UPDATE advisories_exposure SET state = %s WHERE id = %s", ["open", one.pk])
    assert _get(client, EXPOSURES, **params)["count"] == before - 1  # the node's own exposure went with it


@pytest.mark.django_db(transaction=True)
def test_cursor_pages_through_rows_all_tied_and_past_rows_inserted_meanwhile(small_fleet):
    client = small_fleet
    first = _get(client, EXPOSURES, cursor="", limit="2", ordering="-deadline")
    seen = [r["id"] for r in first["results"]]
    late = Exposure.objects.order_by("pk").first()
    assert late is not None
    late.pk = None  # a new row tied with every other (on a new node); its id is the highest
    late.node = Node.objects.create(cluster=late.node.cluster, name="gpu99")
    late.save()
    with CaptureQueriesContext(connection) as queries:
        page = client.get(first["next"], HTTP_ACCEPT="application/json").json()
    assert len(_counted(queries)) == 1  # the write raised the generation: counted again, once
    while True:
        seen += [r["id"] for r in page["results"]]
        if not page["next"]:
            break
        page = client.get(page["next"], HTTP_ACCEPT="application/json").json()
    # Going down by (deadline, id): the new row (the highest id) sorts before the cursor, so it is
    # not shown; every other row once.
    assert seen == sorted(set(seen), reverse=True) and len(seen) == 6 and late.pk not in seen


def datagen_enabled() -> bool:
    from gpusweep import datagen

    return datagen.enabled()
