"""Query parameters: booleans in the usual spellings (others refused), search and ordering on the
lists the console uses, and any parameter a route does not know refused with 400 naming it."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

EXPOSURES = "/api/v1/advisories/exposures/"


@pytest.fixture
def client(seeded):  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(seeded.admin)
    return client


def _ids(client: Client, url: str, **params: str) -> list[int]:
    response = client.get(url, {"limit": "1000", **params})
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


@pytest.mark.parametrize("words", [("true", "1", "yes", "on", "TRUE", "Yes"), ("false", "0", "no", "off", "False")])
def test_boolean_filters_accept_the_usual_spellings(client, words):
    answers = [sorted(_ids(client, EXPOSURES, overdue=word)) for word in words]
    assert all(answer == answers[0] for answer in answers)
    everything = sorted(_ids(client, EXPOSURES))
    other = sorted(_ids(client, EXPOSURES, overdue="false" if words[0] == "true" else "true"))
    assert sorted(answers[0] + other) == everything


@pytest.mark.parametrize("url,param", [(EXPOSURES, "overdue"), ("/api/v1/advisories/advisories/", "needs_review"),
                                       ("/api/v1/inventory/workloads/", "active"),
                                       ("/api/v1/advisories/advisories/", "affects_fleet")])
def test_a_boolean_that_is_not_one_is_refused(client, url, param):
    response = client.get(url, {param: "maybe"})
    assert response.status_code == 400
    assert param in response.json()["errors"] and "yes/no" in response.json()["errors"][param][0]


@pytest.mark.parametrize("url,param", [
    (EXPOSURES, "cve"), ("/api/v1/inventory/nodes/", "clustr"), ("/api/v1/campaigns/campaigns/", "owner"),
    ("/api/v1/campaigns/sweeps/", "search"), ("/api/v1/accounts/tokens/", "user"),
])
def test_an_unknown_query_parameter_is_refused_naming_it(client, url, param):
    response = client.get(url, {param: "x"})
    assert response.status_code == 400, response.content
    assert param in response.json()["errors"] and "takes:" in response.json()["errors"][param][0]


def test_a_detail_route_refuses_unknown_parameters_too(client, seeded):
    campaign = seeded.campaigns["completed"]
    assert client.get(f"/api/v1/campaigns/campaigns/{campaign}/", {"verbose": "1"}).status_code == 400
    assert client.get(f"/api/v1/campaigns/campaigns/{campaign}/compare/", {"old": "1"}).status_code in (200, 404)


def test_nodes_search_and_order(client):
    names = [row["name"] for row in client.get("/api/v1/inventory/nodes/", {"ordering": "-name"}).json()["results"]]
    assert names == sorted(names, reverse=True) and len(names) > 2
    found = client.get("/api/v1/inventory/nodes/", {"search": "cn01"}).json()["results"]
    assert [row["name"] for row in found] == ["cn01"]
    by_cluster = client.get("/api/v1/inventory/nodes/", {"search": "hpc"}).json()["results"]
    assert {row["cluster_name"] for row in by_cluster} == {"hpc"}


def test_exposures_filtered_searched_and_sorted(client):
    rows = client.get(EXPOSURES, {"state": "open", "ordering": "-deadline,node__name", "limit": "1000"}).json()
    deadlines = [r["deadline"] for r in rows["results"] if r["deadline"]]
    assert deadlines == sorted(deadlines, reverse=True) and {r["state"] for r in rows["results"]} == {"open"}
    advisory = rows["results"][0]["advisory_id"]
    found = client.get(EXPOSURES, {"search": advisory, "limit": "1000"}).json()["results"]
    assert found and {r["advisory_id"] for r in found} == {advisory}


def test_advisories_and_campaigns_search_and_order(client):
    advisories = client.get("/api/v1/advisories/advisories/", {"ordering": "-open_exposures"}).json()["results"]
    counts = [a["open_exposures"] for a in advisories]
    assert counts == sorted(counts, reverse=True)
    cve = next(a["cves"][0] for a in advisories if a["cves"])
    by_cve = client.get("/api/v1/advisories/advisories/", {"search": cve}).json()["results"]
    assert by_cve and all(cve in a["cves"] for a in by_cve)
    campaigns = client.get("/api/v1/campaigns/campaigns/", {"search": "sweep", "ordering": "name"}).json()["results"]
    assert [c["name"] for c in campaigns] == ["completed sweep"]


def test_an_unknown_ordering_is_refused(client):
    response = client.get("/api/v1/inventory/nodes/", {"ordering": "secret_column"})
    assert response.status_code == 400 and "ordering" in response.json()["errors"]
