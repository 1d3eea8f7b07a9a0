"""The schema and its docs page need a login, the docs work offline, the schema is valid, and
/readyz tells anonymous callers only whether the service is ready."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.core import signals
from django.core.management import call_command
from django.db import close_old_connections
from django.test import Client
from rest_framework.authtoken.models import Token

from tests.campaigns.test_api import login

pytestmark = pytest.mark.django_db


def test_the_schema_and_the_docs_need_a_login():
    anonymous = Client()
    response = anonymous.get("/api/schema/")
    assert response.status_code == 401 and response.json()["detail"]
    docs = anonymous.get("/api/docs/")
    assert docs.status_code == 302 and docs["Location"].startswith("/accounts/login/")
    viewer = login("vic", "viewer")
    schema = viewer.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200 and schema.json()["info"]["title"] == "gpusweep API"


def test_the_docs_page_loads_swagger_ui_from_our_own_static_files():
    page = login("vic", "viewer").get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    sources = re.findall(r'(?:src|href)="([^"]+)"', html)
    assets = [s for s in sources if s.endswith((".js", ".css", ".png"))]
    assert assets, html[:2000]
    for asset in assets:
        assert asset.startswith("/static/"), f"{asset} is not served by the project (offline docs)"
        assert finders.find(asset.removeprefix("/static/")), f"{asset} is missing from the static files"
    assert "//cdn" not in html and "https://" not in html


def test_the_schema_is_valid_openapi_with_no_generation_warnings(tmp_path: Path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    assert "/api/v1/campaigns/campaigns/{id}/approve/" in text
    assert "Error:" in text  # the error format is a component every operation refers to


@pytest.fixture
def not_ready(settings):
    settings.GPUSWEEP_READYZ_PING_TIMEOUT = 0.2  # no worker runs in this test: fail fast


def test_readyz_tells_anonymous_callers_only_what_failed(not_ready):
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "not ready", "failed": "workers"}


def test_readyz_shows_details_to_staff_by_session_or_token(not_ready, make_user):
    staff = make_user("stella", "viewer")
    staff.is_staff = True
    staff.save()
    client = Client()
    client.force_login(staff)
    body = client.get("/readyz").json()
    assert body["failed"] == "workers" and body["checks"]["database"]["ok"] is True
    assert "vendor" in body["checks"]["database"]
    token = Token.objects.create(user=staff).key
    assert "checks" in Client().get("/readyz", HTTP_AUTHORIZATION=f"Token {token}").json()
    plain = make_user("paul", "viewer")
    assert "checks" not in Client().get(
        "/readyz", HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=plain).key}").json()
    assert "checks" not in Client().get("/readyz", HTTP_AUTHORIZATION="Token not-a-token").json()


# What schemathesis found outside the schema before (issue 15), each checked on its own, in-process.
FOUND = [
    ("GET", "/api/v1/inventory/clusters/", {}),  # node_count required but absent
    ("GET", "/api/v1/inventory/clusters/{id}/", {"id": "cluster"}),
    ("GET", "/api/v1/inventory/nodes/", {}),  # agent_endpoint "" is not a URI
    ("GET", "/api/v1/advisories/exposures/", {}),  # risk_approver null
    ("GET", "/api/v1/inventory/changes/", {}),  # user null
    ("GET", "/api/v1/campaigns/campaigns/{id}/plans/", {"id": "planned"}),  # a list, not an object
    ("POST", "/api/v1/campaigns/campaigns/{id}/plan/", {"id": "draft"}),  # a plan, not a campaign
    ("POST", "/api/v1/campaigns/campaigns/{id}/approve/", {"id": "planned"}),
    ("GET", "/api/v1/campaigns/campaigns/{id}/evidence/", {"id": "completed"}),
    ("DELETE", "/api/v1/inventory/clusters/{id}/", {"id": "cluster"}),  # ProtectedError: now 409
]


def test_the_responses_schemathesis_found_outside_the_schema_now_match_it():
    import schemathesis
    from django.core.wsgi import get_wsgi_application

    from campaigns import queue
    from inventory.models import Cluster
    from tests.api.seed import seed

    queue.ENQUEUE.insert(0, lambda *args: None)  # seed() starts a campaign: no broker here
    try:
        seeded = seed()
    finally:
        queue.ENQUEUE.pop(0)
    auth = {"Authorization": f"Token {seeded.token}"}
    # The WSGI handler closes the database connection after each request, which would end this
    # test's transaction on PostgreSQL; Django's own test client holds the same signals off.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        _check_found(schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(), headers=auth), auth,
                     {**seeded.campaigns, "cluster": Cluster.objects.get(name="local").pk})
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _check_found(schema: Any, auth: dict[str, str], ids: dict[str, int]) -> None:
    assert ids["draft"] and ids["planned"]
    for method, path, parameters in FOUND:
        operation = schema[path][method]
        body = {} if method == "POST" else None
        case = operation.Case(path_parameters={k: ids[v] for k, v in parameters.items()},
                              **({"body": body, "media_type": "application/json"} if body is not None else {}))
        response = case.call(headers=auth)
        assert response.status_code < 500, (method, path, response.text[:500])
        case.validate_response(response, headers=auth)
