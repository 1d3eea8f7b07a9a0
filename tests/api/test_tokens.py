"""API tokens: obtained with a password, named, several per user, listed and revoked by their
owner only, sent as ``Authorization: Bearer`` or ``Token``, expiring, and accepted by the web
export URLs (and by no other page)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from accounts import services
from accounts.models import ApiToken

pytestmark = pytest.mark.django_db

NODES = "/api/v1/inventory/nodes/"


def _obtain(client: Client, username: str, password: str, **extra: object) -> object:
    return client.post("/api/v1/accounts/token/", {"username": username, "password": password, **extra},
                       content_type="application/json")


def test_it_issues_a_named_token_for_a_password_and_shows_the_key_once(make_user):
    make_user("vera", "viewer")
    response = _obtain(Client(), "vera", "pw-vera-12345", name="jira")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "jira" and body["key"].startswith("gst_") and body["active"] is True
    stored = ApiToken.objects.get(pk=body["id"])
    assert body["key"] not in (stored.key_hash, stored.prefix) and body["key"].startswith(stored.prefix)
    # Listed afterwards without the key.
    listed = Client().get("/api/v1/accounts/tokens/", HTTP_AUTHORIZATION=f"Bearer {body['key']}").json()
    assert [t["name"] for t in listed["results"]] == ["jira"] and "key" not in listed["results"][0]


def test_a_wrong_password_gets_no_token(make_user):
    make_user("vera", "viewer")
    response = _obtain(Client(), "vera", "not-her-password")
    assert response.status_code == 401 and ApiToken.objects.count() == 0
    assert _obtain(Client(), "vera", "pw-vera-12345", name="").status_code == 400


@pytest.mark.parametrize("keyword", ["Bearer", "Token", "bearer"])
def test_both_keywords_authenticate_and_stamp_the_last_use(make_user, keyword):
    vera = make_user("vera", "viewer")
    token, key = services.issue(vera, "script")
    assert token.last_used_at is None
    response = Client().get(NODES, HTTP_AUTHORIZATION=f"{keyword} {key}")
    assert response.status_code == 200, response.content
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_bad_token_is_refused_with_a_bearer_challenge(make_user):
    response = Client().get(NODES, HTTP_AUTHORIZATION="Bearer gst_nonsense")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["detail"]


def test_drf_tokens_made_in_the_admin_still_work_under_either_keyword(make_user):
    from rest_framework.authtoken.models import Token

    key = Token.objects.create(user=make_user("olga", "operator")).key
    for keyword in ("Token", "Bearer"):
        assert Client().get(NODES, HTTP_AUTHORIZATION=f"{keyword} {key}").status_code == 200


def test_a_user_holds_several_tokens_and_sees_and_revokes_only_their_own(make_user):
    vera, olga = make_user("vera", "viewer"), make_user("olga", "operator")
    _one, key_one = services.issue(vera, "one")
    _two, key_two = services.issue(vera, "two", expires_at=timezone.now() + dt.timedelta(days=30))
    theirs, _ = services.issue(olga, "olga's")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key_one}"}
    client = Client()
    listed = client.get("/api/v1/accounts/tokens/", **auth).json()["results"]
    assert sorted(t["name"] for t in listed) == ["one", "two"]
    # Someone else's token is not found, and stays alive.
    assert client.delete(f"/api/v1/accounts/tokens/{theirs.pk}/", **auth).status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    # A new one through the API: the key once; the same live name twice is refused.
    made = client.post("/api/v1/accounts/tokens/", {"name": "three"}, content_type="application/json", **auth)
    assert made.status_code == 201 and made.json()["key"].startswith("gst_")
    again = client.post("/api/v1/accounts/tokens/", {"name": "three"}, content_type="application/json", **auth)
    assert again.status_code == 400 and "name" in again.json()["errors"]
    # Revoking "two" ends it at once; "one" still works.
    assert client.delete(f"/api/v1/accounts/tokens/{_two.pk}/", **auth).status_code == 204
    assert client.get(NODES, HTTP_AUTHORIZATION=f"Bearer {key_two}").status_code == 401
    assert client.get(NODES, **auth).status_code == 200


def test_an_expired_token_is_refused(make_user):
    vera = make_user("vera", "viewer")
    token, key = services.issue(vera, "short", expires_at=timezone.now() + dt.timedelta(seconds=60))
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert Client().get(NODES, HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 401
    with pytest.raises(services.TokenError):
        services.issue(vera, "past", expires_at=timezone.now() - dt.timedelta(days=1))


def test_a_user_with_no_role_manages_tokens_but_reads_nothing(make_user):
    nobody = make_user("nora")
    _token, key = services.issue(nobody, "mine")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    assert Client().get("/api/v1/accounts/tokens/", **auth).status_code == 200
    assert Client().get(NODES, **auth).status_code == 403


def test_web_exports_take_a_token_and_other_pages_do_not(seeded, make_user):
    _token, key = services.issue(make_user("vera", "viewer"), "auditor script")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    client = Client()
    csv = client.get("/advisories/exposures/?format=csv", **auth)
    assert csv.status_code == 200 and csv["Content-Type"].startswith("text/csv")
    evidence = client.get(f"/campaigns/{seeded.campaigns['completed']}/evidence.json", **auth)
    assert evidence.status_code == 200 and evidence.json()["verified"] is True
    # No session came of it, and a page that is not an export wants a login.
    assert "sessionid" not in client.cookies
    assert client.get("/campaigns/", **auth).status_code == 401
    assert client.get("/advisories/exposures/?format=csv").status_code == 302
    assert client.get("/advisories/exposures/?format=csv", HTTP_AUTHORIZATION="Bearer gst_wrong").status_code == 401


@pytest.mark.django_db(transaction=True)  # generations rise on commit
def test_without_a_shared_cache_a_token_is_read_once_per_generation_and_a_change_counts_at_once(make_user):
    """No GPUSWEEP_CACHE_URL (the default): the token's check is kept in the process's memory under
    the generations read on each request, so a second request reads no token row, and a revocation
    in SQL, a role taken away or a user deactivated (writes of the tables it read) count at the next
    request (issue 24 item 4, issue 33)."""
    from django.contrib.auth.models import Group
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from gpusweep import datagen

    assert not datagen.enabled()  # the per-process path, not the shared cache
    vera = make_user("vera", "viewer")
    token, key = services.issue(vera, "jira")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    client = Client()
    assert client.get(NODES, **auth).status_code == 200  # reads the token and stamps its last use
    assert client.get(NODES, **auth).status_code == 200  # reads it again: the stamp was a write
    with CaptureQueriesContext(connection) as queries:
        assert client.get(NODES, **auth).status_code == 200
    assert not [q for q in queries.captured_queries if ApiToken._meta.db_table in q["sql"]]

    vera.groups.remove(Group.objects.get(name="viewer"))
    assert client.get(NODES, **auth).status_code == 403
    vera.groups.add(Group.objects.get(name="viewer"))
    assert client.get(NODES, **auth).status_code == 200
    type(vera).objects.filter(pk=vera.pk).update(is_active=False)
    assert client.get(NODES, **auth).status_code == 401
    type(vera).objects.filter(pk=vera.pk).update(is_active=True)
    assert client.get(NODES, **auth).status_code == 200
    q = connection.ops.quote_name
    table, revoked, pk = q(ApiToken._meta.db_table), q(ApiToken._meta.get_field("revoked_at").column), q(
        ApiToken._meta.pk.column)
    with connection.cursor() as cursor:  # as psql would: no gpusweep code runs
        cursor.execute(f"UPDATE {table} SET {revoked} = %s WHERE {pk} = %s", [timezone.now(), token.pk])
    assert client.get(NODES, **auth).status_code == 401
