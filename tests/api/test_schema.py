"""The schema and its docs page need a login, the docs work offline, the schema is valid, and
/readyz tells anonymous callers only whether the service is ready."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.test import Client
from rest_framework.authtoken.models import Token

from tests.campaigns.fleet import user

pytestmark = pytest.mark.django_db


def login(name: str, *roles: str) -> Client:
    user(name, *roles)
    client = Client()
    assert client.login(username=name, password=f"pw-{name}-123456")
    return client


def test_the_schema_and_the_docs_need_a_login():
    anonymous = Client()
    response = anonymous.get("/api/schema/")
    assert response.status_code == 403 and response.json()["detail"]
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
