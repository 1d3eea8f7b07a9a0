"""What a careless or hostile client sends gets a clear 4xx in the API's one error format, and
nothing changes: the cases of issue 15 (server errors from ids, limits, filters, deep JSON,
oversized bodies), under DEBUG too, where Django would answer an HTML debug page."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from campaigns import services
from campaigns.models import Approval, Campaign, EvidenceEvent, NodeSweep
from gpusweep.errors import flatten_errors
from inventory.models import Cluster
from tests.campaigns.fleet import approved_campaign, make_fleet, user
from tests.campaigns.test_api import login

pytestmark = pytest.mark.django_db

CAMPAIGNS = "/api/v1/campaigns/campaigns/"


@pytest.fixture
def admin() -> Client:
    make_fleet(nodes=2, spares=1)
    return login("ada", "admin")


@pytest.fixture(params=[False, True], ids=["production", "debug"])
def debug(request, settings) -> bool:
    settings.DEBUG = request.param
    return request.param


def assert_error(response, status: int) -> dict:
    """The API's error format: JSON with a `detail` sentence (and `errors` per field)."""
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    assert set(body) <= {"detail", "errors"}
    return body


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def counts() -> tuple[int, int, int, int]:
    return Campaign.objects.count(), Approval.objects.count(), EvidenceEvent.objects.count(), Cluster.objects.count()


def test_an_unknown_or_malformed_campaign_id_is_a_404_for_every_action(admin, debug):
    before = counts()
    for pk in ("999999", "abc", "99999999999999999999999"):
        for name in ("approve", "start", "pause", "resume", "abort", "plan"):
            assert_error(admin.post(f"{CAMPAIGNS}{pk}/{name}/", {}, content_type="application/json"), 404)
        assert_error(admin.get(f"{CAMPAIGNS}{pk}/"), 404)
    assert counts() == before


@pytest.mark.parametrize("path", ["/api/v1/campaigns/events/", "/api/v1/advisories/advisories/",
                                  "/api/v1/inventory/clusters/"])
def test_a_limit_or_offset_out_of_range_is_refused_naming_the_parameter(admin, path):
    for query, name in (("limit=35280604909139992576", "limit"), ("limit=0", "limit"), ("limit=abc", "limit"),
                        ("offset=-1", "offset"), ("offset=99999999999999999999", "offset")):
        body = assert_error(admin.get(f"{path}?{query}"), 400)
        assert name in body["errors"], body
    assert admin.get(f"{path}?limit=1000&offset=5").status_code == 200


def test_an_integer_filter_out_of_range_is_refused(admin, debug):
    for query in ("inventory/nodes/?cluster_id=-2.7e218", "inventory/nodes/?cluster_id=1.5",
                  "campaigns/sweeps/?wave=99999999999999999999", "campaigns/events/?campaign=1e300",
                  "inventory/changes/?object_id=-99999999999999999999"):
        body = assert_error(admin.get(f"/api/v1/{query}"), 400)
        assert body["errors"], body
    cluster = Cluster.objects.get(name="local")
    assert admin.get(f"/api/v1/inventory/nodes/?cluster_id={cluster.pk}").json()["count"] == 3


def test_a_deeply_nested_body_is_refused_and_nothing_is_written(admin, debug):
    make_campaign = {"name": "deep", "node_selector": {"sweep": "yes"}}
    created = admin.post(CAMPAIGNS, make_campaign, content_type="application/json")
    assert created.status_code == 201, created.content
    before = counts()
    bodies = [
        (CAMPAIGNS, f'{{"name": "x", "node_selector": {{"a": {deep(950)}}}}}'),
        ("/api/v1/inventory/clusters/", f'{{"name": "c2", "kind": "static", "connection": {deep(950)}}}'),
        (f"{CAMPAIGNS}{created.json()['id']}/approve/", f'{{"comment": {deep(950)}}}'),
        (CAMPAIGNS, deep(100_000)),  # beyond what json itself can parse
    ]
    for path, body in bodies:
        response = assert_error(admin.post(path, body, content_type="application/json"), 400)
        assert "nested deeper than" in response["detail"]
    assert counts() == before


def test_json_the_database_cannot_store_is_refused(admin):
    before = counts()
    for body in ('{"name": "x", "node_selector": {"a": NaN}}', '{"name": "x", "node_selector": {"a": 1e400}}',
                 '{"name": "x", "node_selector": {"a": "\\u0000"}}', '{"name": "x", "node_selector": {"\\u0000": 1}}',
                 '{"name": "x"', "\xff"):
        assert_error(admin.post(CAMPAIGNS, body, content_type="application/json"), 400)
    assert counts() == before


def test_a_body_over_the_upload_limit_answers_the_api_format(admin, debug, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    before = counts()
    big = json.dumps({"name": "big", "description": "x" * (65 * 1024)})
    body = assert_error(admin.post(CAMPAIGNS, big, content_type="application/json"), 413)
    assert "too large" in body["detail"]
    # A plain Django view under /api/ (the agent heartbeat) too, before any signature check.
    assert_error(Client().post("/api/v1/inventory/agent/heartbeat", big, content_type="application/json"), 413)
    assert counts() == before


def test_unknown_urls_wrong_methods_and_nul_characters_answer_the_api_format(admin, debug):
    assert_error(admin.get("/api/v1/nowhere/"), 404)
    assert_error(admin.get("/api/v1/campaigns/campaigns/1/evidence.json"), 404)
    assert_error(admin.delete(f"{CAMPAIGNS}1/"), 405)
    assert_error(admin.get("/api/v1/inventory/agent/heartbeat"), 405)
    assert_error(admin.get("/api/v1/advisories/cves/%00/"), 400)
    assert_error(admin.get("/api/v1/inventory/nodes/?name=a%00b"), 400)
    assert_error(Client().get(CAMPAIGNS), 401)  # anonymous: the Bearer challenge


def test_the_api_takes_json_and_an_empty_form(admin):
    before = counts()
    form = admin.post("/api/v1/inventory/clusters/", {"name": "c2", "kind": "static", "connection": "null"})
    assert "JSON" in assert_error(form, 415)["detail"]
    assert counts() == before
    # An action without parameters posted as an (empty) form still works.
    cluster = Cluster.objects.get(name="local")
    static = admin.post(f"/api/v1/inventory/clusters/{cluster.pk}/sync/")
    assert "static clusters" in assert_error(static, 400)["errors"]["kind"][0]


def test_field_errors_are_named_with_dots_and_positions():
    detail = {"windows": [{}, {"start": ["bad time"]}], "name": ["required"], "non_field_errors": ["x"]}
    assert flatten_errors(detail) == {"windows[1].start": ["bad time"], "name": ["required"],
                                      "non_field_errors": ["x"]}
    assert flatten_errors(["only this"]) == {"non_field_errors": ["only this"]}


def test_times_and_durations_the_database_cannot_hold_are_refused(admin):
    assert admin.get("/api/v1/inventory/changes/?since=2020-01-01T00:00:00-18:07").status_code == 200  # UTC
    assert_error(admin.get("/api/v1/inventory/changes/?since=0001-01-01T00:00:00%2B05:00"), 400)
    campaign = admin.post(CAMPAIGNS, {"name": "times"}, content_type="application/json").json()
    url = f"{CAMPAIGNS}{campaign['id']}/"
    for body in ({"wait_limit": "999999999 00:00:00"}, {"deadline": "0001-01-01T00:00:00+05:00"},
                 {"deadline": "9999-12-31T23:59:59-05:00"}):
        response = admin.patch(url, body, content_type="application/json")
        assert response.status_code in (200, 400), (body, response.content)
    stored = admin.patch(url, {"deadline": "2027-01-01T00:00:00-18:07"}, content_type="application/json")
    assert stored.status_code == 200 and stored.json()["deadline"] == "2027-01-01T18:07:00Z"


def test_a_cluster_still_referenced_by_a_campaign_is_not_deleted(admin):
    cluster = Cluster.objects.get(name="local")
    operator, approver = user("olga", "operator"), user("abe", "approver")
    campaign = approved_campaign(operator, approver)
    services.start(campaign.pk, operator)
    assert NodeSweep.objects.filter(node__cluster=cluster).exists()
    body = assert_error(admin.delete(f"/api/v1/inventory/clusters/{cluster.pk}/"), 409)
    assert "still referenced by node sweeps" in body["detail"]
    assert Cluster.objects.filter(pk=cluster.pk).exists()


def test_node_labels_must_be_names_and_texts(admin):
    node = Cluster.objects.get(name="local").nodes.order_by("pk").first()
    url = f"/api/v1/inventory/nodes/{node.pk}/"
    for labels in (True, ["a"], {"a": 1}, {"a": {"b": "c"}}, {"k" * 400: "v"}):
        body = assert_error(admin.patch(url, {"labels": labels}, content_type="application/json"), 400)
        assert "labels" in body["errors"]
    node.refresh_from_db()
    assert node.labels == {"sweep": "yes"}
    assert admin.patch(url, {"labels": {"rack": "r1"}}, content_type="application/json").status_code == 200
