"""Single sign-on against a real OpenID provider (tests/oidc/provider.js: npm's certified
oidc-provider on 127.0.0.1), driven as a browser would: the Django test client on gpusweep's side,
requests with cookies at the provider's (its login form, its logout confirmation)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from accounts import oidc
from accounts.models import OidcIdentity
from gpusweep.roles import Role, user_roles
from tests.oidc.idp import Browser, Provider, confirm_logout, password, running

HOME = "http://testserver"
USERS = {
    "alice": {"password": "alice-pw-1", "sub": "0c6f0c7e-alice", "email": "alice@example.test", "given_name": "Alice",
              "family_name": "Liddell", "groups": ["sec-viewers", "sre", "unrelated-team"]},
    "bob": {"password": "bob-pw-1", "sub": "7d1e-bob", "email": "bob@example.test", "groups": ["gpusweep-admins"]},
    "carol": {"password": "carol-pw-1", "sub": "93a0-carol", "groups": ["someone-else"]},
}
# What GPUSWEEP_LOCAL_LOGIN=false sets (gpusweep/settings.py)
LOCAL_LOGIN_OFF = {"GPUSWEEP_LOCAL_LOGIN": False,
                   "AUTHENTICATION_BACKENDS": ["accounts.backends.BreakGlassBackend", "accounts.oidc.OidcBackend"]}


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    with running(tmp_path, USERS, [HOME]) as found:
        oidc.forget_discovery()
        yield found


@pytest.fixture
def sso(provider: Provider) -> Iterator[Provider]:
    with override_settings(**provider.settings()):
        yield provider


def sign_in(client: Client, browser: Browser, username: str, next_url: str = "/") -> Any:
    """The whole code flow: gpusweep -> the provider (its login form, when it has no session) -> back."""
    start = client.get("/accounts/oidc/authenticate/", {"next": next_url})
    assert start.status_code == 302, start.content
    back = browser.walk(start["Location"], password(username, str(USERS[username]["password"])))
    assert back.startswith(f"{HOME}/accounts/oidc/callback/?"), back
    return client.get(back.removeprefix(HOME))


def roles_of(username: str) -> set[Role]:
    return user_roles(User.objects.get(username=username))


@pytest.mark.django_db
def test_the_login_page_offers_the_provider_and_the_password_form(sso: Provider, client: Client) -> None:
    page = client.get("/accounts/login/?next=/nodes/").content.decode()
    assert "Sign in with Test IdP" in page
    assert 'href="/accounts/oidc/authenticate/?next=%2Fnodes%2F"' in page
    assert 'name="password"' in page  # local accounts stay possible


@pytest.mark.django_db
def test_a_first_sign_in_makes_the_user_with_the_roles_of_its_groups(sso: Provider, client: Client) -> None:
    browser = Browser(HOME)
    done = sign_in(client, browser, "alice", "/nodes/")
    assert done.status_code == 302 and done["Location"] == "/nodes/"
    assert any("Sign in" in page for page in browser.pages)  # the provider's own login form
    alice = User.objects.get(username="alice")
    assert (alice.email, alice.first_name, alice.last_name) == ("alice@example.test", "Alice", "Liddell")
    assert not alice.has_usable_password()
    assert OidcIdentity.objects.get(user=alice).subject == USERS["alice"]["sub"]
    assert roles_of("alice") == {Role.VIEWER, Role.OPERATOR}  # "unrelated-team" maps to nothing
    assert client.get("/nodes/").status_code == 200
    assert 0 < client.session.get_expiry_age() <= 8 * 3600  # GPUSWEEP_OIDC_SESSION_S
    # the session's user is the signed-in one
    assert client.get("/api/v1/accounts/tokens/").status_code == 200


@pytest.mark.django_db
def test_a_group_removed_at_the_provider_loses_its_role_at_the_next_sign_in(sso: Provider, client: Client) -> None:
    sign_in(client, Browser(HOME), "alice")
    assert roles_of("alice") == {Role.VIEWER, Role.OPERATOR}
    alice = User.objects.get(username="alice")
    sso.set_user("alice", groups=["sec-viewers"], preferred_username="alice.renamed")
    client.post("/accounts/logout/")

    again = Client()
    sign_in(again, Browser(HOME), "alice")
    assert roles_of("alice") == {Role.VIEWER}
    # matched by `sub`, not by name: the same user, its name unchanged
    assert User.objects.filter(oidc_identity__subject=USERS["alice"]["sub"]).get() == alice
    assert not User.objects.filter(username="alice.renamed").exists()
    assert again.post("/api/v1/campaigns/campaigns/", {}, content_type="application/json").status_code == 403

    sso.set_user("alice", groups=["sec-approvers", "gpusweep-admins"])
    sign_in(Client(), Browser(HOME), "alice")
    assert roles_of("alice") == {Role.APPROVER, Role.ADMIN}
    sso.set_user("alice", groups=[])
    sign_in(Client(), Browser(HOME), "alice")
    assert roles_of("alice") == set()


@pytest.mark.django_db
def test_a_user_with_no_mapped_group_signs_in_with_no_role(sso: Provider, client: Client) -> None:
    sign_in(client, Browser(HOME), "carol")
    assert roles_of("carol") == set()
    assert client.get("/nodes/").status_code == 403  # gpusweep.middleware: no role, no page


@pytest.mark.django_db
def test_other_groups_of_a_user_are_left_alone(sso: Provider, client: Client) -> None:
    from django.contrib.auth.models import Group

    sign_in(client, Browser(HOME), "bob")
    bob = User.objects.get(username="bob")
    bob.groups.add(Group.objects.create(name="auditors"))
    sso.set_user("bob", groups=["sec-viewers"])
    sign_in(Client(), Browser(HOME), "bob")
    assert set(bob.groups.values_list("name", flat=True)) == {"auditors", "viewer"}


@pytest.mark.django_db
def test_a_provider_account_never_takes_over_a_local_account_of_its_name(sso: Provider, client: Client,
                                                                          make_user: Any) -> None:
    local = make_user("alice", "admin")
    sign_in(client, Browser(HOME), "alice")
    signed_in = User.objects.get(oidc_identity__subject=USERS["alice"]["sub"])
    assert signed_in != local and signed_in.username == "alice-2"
    assert roles_of("alice") == {Role.ADMIN}
    assert user_roles(signed_in) == {Role.VIEWER, Role.OPERATOR}


@pytest.mark.django_db
def test_logout_ends_the_session_here_and_at_the_provider(sso: Provider, client: Client) -> None:
    browser = Browser(HOME)
    sign_in(client, browser, "alice")
    assert client.get("/").status_code == 200

    out = client.post("/accounts/logout/")
    assert out.status_code == 302
    assert out["Location"].startswith(f"{sso.issuer}/session/end?"), out["Location"]
    assert "id_token_hint=" in out["Location"]
    assert client.get("/").status_code == 302  # the gpusweep session is over at once
    back = browser.walk(out["Location"], confirm_logout)
    assert back == f"{HOME}/accounts/login/"

    # the provider's session is over too: the next sign-in asks for the password again
    sign_in(client, browser, "alice")
    assert any('name="password"' in page for page in browser.pages)
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_without_logout_the_provider_signs_in_again_without_a_password(sso: Provider, client: Client) -> None:
    browser = Browser(HOME)
    sign_in(client, browser, "alice")
    client.logout()  # only gpusweep's session (a local logout, as without an end_session_endpoint)
    start = client.get("/accounts/oidc/authenticate/")
    back = browser.walk(start["Location"])  # no form on the way: single sign-on
    assert client.get(back.removeprefix(HOME)).status_code == 302
    assert client.get("/").status_code == 200


@pytest.mark.django_db
def test_a_forged_or_replayed_callback_signs_nobody_in(sso: Provider, client: Client) -> None:
    start = client.get("/accounts/oidc/authenticate/")
    back = Browser(HOME).walk(start["Location"], password("alice", "alice-pw-1"))
    other = Client()  # another browser: no state of this sign-in in its session
    refused = other.get(back.removeprefix(HOME))
    assert refused.status_code == 302 and refused["Location"] == "/accounts/login/"
    assert other.get("/").status_code == 302
    assert client.get(back.removeprefix(HOME))["Location"] == "/"  # the right browser gets in
    client.logout()
    replayed = client.get(back.removeprefix(HOME))  # a code and its state serve once
    assert replayed.status_code == 302 and replayed["Location"] == "/accounts/login/"
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_a_wrong_client_secret_signs_nobody_in(provider: Provider, client: Client) -> None:
    with override_settings(**provider.settings(OIDC_RP_CLIENT_SECRET="not-the-secret")):
        done = sign_in(client, Browser(HOME), "alice")
        assert done["Location"] == "/accounts/login/"
        page = client.get("/accounts/login/").content.decode()
    assert "Signing in with Test IdP failed" in page
    assert not User.objects.filter(username="alice").exists()


@pytest.mark.django_db
def test_an_unreachable_provider_answers_on_the_login_page(provider: Provider, client: Client) -> None:
    with override_settings(**provider.settings(GPUSWEEP_OIDC_ISSUER="http://127.0.0.1:9/nothing")):
        answer = client.get("/accounts/oidc/authenticate/")
        assert answer["Location"] == "/accounts/login/"
        assert "Test IdP cannot be reached" in client.get("/accounts/login/").content.decode()


@pytest.mark.django_db
def test_behind_a_tls_proxy_the_redirect_uri_is_https(sso: Provider, client: Client) -> None:
    with override_settings(SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")):
        start = client.get("/accounts/oidc/authenticate/", HTTP_X_FORWARDED_PROTO="https", HTTP_HOST="testserver")
    assert "&redirect_uri=https%3A%2F%2Ftestserver%2Faccounts%2Foidc%2Fcallback%2F&" in start["Location"]


@pytest.mark.django_db
def test_local_login_switched_off_refuses_passwords(sso: Provider, client: Client, make_user: Any) -> None:
    make_user("vera", "viewer")
    root = User.objects.create_superuser("root", password="root-pw-12345")
    with override_settings(**LOCAL_LOGIN_OFF):
        page = client.get("/accounts/login/").content.decode()
        assert "Sign in with Test IdP" in page and 'name="password"' not in page
        refused = client.post("/accounts/login/", {"username": "vera", "password": "pw-vera-12345"})
        assert refused.status_code == 403
        assert client.get("/").status_code == 302
        assert not client.login(username="vera", password="pw-vera-12345")
        assert client.post("/api/v1/accounts/token/", {"username": "vera", "password": "pw-vera-12345", "name": "x"},
                           content_type="application/json").status_code == 401
        # the console's form refuses a superuser too; the admin site's login takes one (the way in
        # while the provider is down), and only a superuser
        assert client.post("/accounts/login/", {"username": "root", "password": "root-pw-12345"}).status_code == 403
        User.objects.filter(username="vera").update(is_staff=True)
        assert client.post("/admin/login/", {"username": "vera", "password": "pw-vera-12345",
                                             "next": "/admin/"}).status_code == 200  # the form again
        assert client.get("/").status_code == 302
        admin = client.post("/admin/login/", {"username": "root", "password": "root-pw-12345", "next": "/admin/"})
        assert admin.status_code == 302 and admin["Location"] == "/admin/"
        assert client.get("/").status_code == 200
        client.logout()
        # single sign-on still signs in
        sign_in(client, Browser(HOME), "alice")
        assert client.get("/nodes/").status_code == 200
    assert root.is_superuser


@pytest.mark.django_db
def test_api_tokens_are_unchanged_for_a_user_of_the_provider(sso: Provider, client: Client) -> None:
    sign_in(client, Browser(HOME), "alice")
    made = client.post("/api/v1/accounts/tokens/", {"name": "ci"}, content_type="application/json")
    assert made.status_code == 201, made.content
    key = made.json()["key"]
    with override_settings(**LOCAL_LOGIN_OFF):
        answer = Client().get("/api/v1/inventory/nodes/", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert answer.status_code == 200


@pytest.mark.django_db
def test_without_single_sign_on_nothing_changes(client: Client, make_user: Any) -> None:
    page = client.get("/accounts/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page
    assert client.get("/accounts/oidc/authenticate/").status_code == 404
    assert client.get("/accounts/oidc/callback/?code=x&state=y").status_code == 404
    make_user("vera", "viewer")
    assert client.post("/accounts/login/", {"username": "vera", "password": "pw-vera-12345"}).status_code == 302
    assert client.get("/").status_code == 200
    assert client.post("/accounts/logout/")["Location"] == "/accounts/login/"
