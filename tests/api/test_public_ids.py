"""One public identifier per advisory (`nvidia-5703`): the API, its filters, campaigns and reports
name advisories by it, an unknown one is a 400, and no answer carries an advisory's database id."""

from __future__ import annotations

import re

import pytest
from django.core.management.color import no_style
from django.db import connection
from django.test import Client

from advisories.models import Advisory
from campaigns.models import Campaign
from tests.api.seed import seed

pytestmark = pytest.mark.django_db
API = "/api/v1/advisories"
FIRST_PK = 9_876_500  # advisories' ids start here: a number no other row or count comes near


@pytest.fixture
def seeded():  # type: ignore[no-untyped-def]
    Advisory.objects.create(pk=FIRST_PK, publisher="Test", publisher_id="dummy", title="t", source_kind="file")
    with connection.cursor() as cursor:  # PostgreSQL's sequence follows the explicit id (SQLite's does itself)
        for sql in connection.ops.sequence_reset_sql(no_style(), [Advisory]):
            cursor.execute(sql)
    data = seed()
    assert Advisory.objects.filter(pk__gt=FIRST_PK).exists()
    client = Client(HTTP_AUTHORIZATION=f"Token {data.token}")
    return data, client


def _get_paths(client: Client) -> list[str]:
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    return [path for path, ops in schema["paths"].items() if "get" in ops and "{" not in path]


def test_filters_take_public_ids_and_refuse_anything_else(seeded):  # type: ignore[no-untyped-def]
    _data, client = seeded
    advisory = Advisory.objects.get(publisher_id="5703")
    assert advisory.public_id == "nvidia-5703"
    for path in ("exposures", "ranges", "cves", "review-items"):
        rows = client.get(f"{API}/{path}/", {"advisory": "NVIDIA-5703", "limit": "1000"})
        assert rows.status_code == 200, (path, rows.content)
        for bad in (str(advisory.pk), "5703", "nvidia-0000"):
            refused = client.get(f"{API}/{path}/", {"advisory": bad})
            assert refused.status_code == 400 and "advisory" in refused.json()["errors"], (path, bad)
    exposures = client.get(f"{API}/exposures/", {"advisory": "nvidia-5703", "limit": "1000"}).json()["results"]
    assert exposures and {e["advisory"] for e in exposures} == {"nvidia-5703"}
    detail = client.get(f"{API}/advisories/nvidia-5703/").json()
    assert detail["id"] == "nvidia-5703" and detail["publisher_id"] == "5703"
    assert client.get(f"{API}/advisories/{advisory.pk}/").status_code == 404
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    params = schema["paths"][f"{API}/exposures/"]["get"]["parameters"]
    assert "public id" in next(p for p in params if p["name"] == "advisory")["description"]


def test_campaigns_name_advisories_by_public_id(seeded):  # type: ignore[no-untyped-def]
    _data, client = seeded
    body = {"name": "by public id", "clusters": ["local"], "node_selector": {"sweep": "yes"},
            "target_versions": {"driver": {"R570": "570.195.03"}}}
    made = client.post("/api/v1/campaigns/campaigns/", {**body, "advisories": ["nvidia-5703"]},
                       content_type="application/json")
    assert made.status_code == 201, made.content
    assert made.json()["advisories"] == ["nvidia-5703"]
    assert list(Campaign.objects.get(pk=made.json()["id"]).advisories.values_list("publisher_id", flat=True)) == [
        "5703"]
    pk = Advisory.objects.get(publisher_id="5703").pk
    for bad in ([pk], [str(pk)], ["5703"]):
        refused = client.post("/api/v1/campaigns/campaigns/", {**body, "advisories": bad},
                              content_type="application/json")
        assert refused.status_code == 400 and "advisories" in refused.json()["errors"], bad


def test_no_answer_of_the_api_carries_an_advisory_database_id(seeded):  # type: ignore[no-untyped-def]
    data, client = seeded
    for campaign in Campaign.objects.all():
        campaign.advisories.set(Advisory.objects.all())
    advisory = Advisory.objects.get(publisher_id="5703")
    urls = [f"{path}?limit=1000" if not path.endswith((".json", ".csv", ".pdf")) else path
            for path in _get_paths(client)]
    urls += [f"{API}/advisories/{advisory.public_id}/", f"{API}/advisories/{advisory.public_id}/vex/",
             f"/api/v1/reports/advisories/{advisory.public_id}/report.json", "/api/v1/reports/pending.json",
             *(f"/api/v1/reports/campaigns/{pk}/report.json" for pk in data.campaigns.values())]
    ids = re.compile(r"(?<![\w.])(?:" + "|".join(str(pk) for pk in Advisory.objects.values_list("pk", flat=True))
                     + r")(?![\w.])")
    read = 0
    for url in urls:
        if url.endswith((".pdf", ".csv")) or "/schema/" in url:
            continue
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        text = response.content.decode()
        assert not ids.search(text), (url, ids.search(text))
        read += "nvidia-" in text
    assert read >= 8  # the check read answers that name advisories
