"""Single sign-on's settings as the environment gives them (gpusweep/settings.py run afresh)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from gpusweep import env
from gpusweep.roles import Role

SETTINGS = Path(__file__).resolve().parents[2] / "gpusweep" / "settings.py"
NAMES = ("GPUSWEEP_OIDC_ISSUER", "GPUSWEEP_OIDC_CLIENT_ID", "GPUSWEEP_OIDC_CLIENT_SECRET", "GPUSWEEP_OIDC_ROLE_MAP",
         "GPUSWEEP_OIDC_SCOPES", "GPUSWEEP_OIDC_TOKEN_AUTH", "GPUSWEEP_LOCAL_LOGIN", "GPUSWEEP_OIDC_TOKEN_ENDPOINT",
         "GPUSWEEP_TRUST_FORWARDED_PROTO")
SSO = {"GPUSWEEP_OIDC_ISSUER": "https://sso.example.org/realms/sec", "GPUSWEEP_OIDC_CLIENT_ID": "gpusweep",
       "GPUSWEEP_OIDC_CLIENT_SECRET": "from-the-environment"}


def load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **environ: str) -> dict[str, Any]:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUSWEEP_VAR_DIR", str(tmp_path))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS))


def test_unset_changes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    found = load(monkeypatch, tmp_path)
    assert found["GPUSWEEP_OIDC_ISSUER"] == ""
    assert found["AUTHENTICATION_BACKENDS"] == ["django.contrib.auth.backends.ModelBackend"]
    assert found["GPUSWEEP_LOCAL_LOGIN"] is True
    assert "SECURE_PROXY_SSL_HEADER" not in found


def test_behind_a_tls_proxy_the_redirect_uri_is_https(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    found = load(monkeypatch, tmp_path, GPUSWEEP_TRUST_FORWARDED_PROTO="true")
    assert found["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")


def test_an_issuer_turns_single_sign_on_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    found = load(monkeypatch, tmp_path, **SSO, GPUSWEEP_OIDC_SCOPES="openid,email profile groups",
                 GPUSWEEP_OIDC_ROLE_MAP='{"sec-viewers": "viewer", "sre": ["operator", "viewer"], '
                                        '"gpusweep-admins": "admin"}',
                 GPUSWEEP_OIDC_TOKEN_ENDPOINT="https://sso.example.org/token")
    assert found["AUTHENTICATION_BACKENDS"] == ["django.contrib.auth.backends.ModelBackend",
                                                "accounts.oidc.OidcBackend"]
    assert found["GPUSWEEP_OIDC_ROLE_MAP"] == {"sec-viewers": ["viewer"], "sre": ["operator", "viewer"],
                                               "gpusweep-admins": ["admin"]}
    assert (found["OIDC_RP_CLIENT_ID"], found["OIDC_RP_CLIENT_SECRET"]) == ("gpusweep", "from-the-environment")
    assert found["OIDC_RP_SCOPES"] == "openid email profile groups"
    assert found["GPUSWEEP_OIDC_ENDPOINTS"] == {"token_endpoint": "https://sso.example.org/token"}
    assert found["GPUSWEEP_OIDC_GROUPS_CLAIM"] == "groups"
    assert found["OIDC_TOKEN_USE_BASIC_AUTH"] is True
    # the secret is one of the service's own settings: no webhook or cluster may name it
    assert "GPUSWEEP_OIDC_CLIENT_SECRET" in env.OWN_NAMES


def test_local_login_switched_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    found = load(monkeypatch, tmp_path, **SSO, GPUSWEEP_LOCAL_LOGIN="false")
    assert found["AUTHENTICATION_BACKENDS"] == ["accounts.backends.BreakGlassBackend", "accounts.oidc.OidcBackend"]
    with pytest.raises(ImproperlyConfigured, match="needs GPUSWEEP_OIDC_ISSUER"):
        load(monkeypatch, tmp_path, GPUSWEEP_LOCAL_LOGIN="false")


@pytest.mark.parametrize(("environ", "error"), [
    ({"GPUSWEEP_OIDC_ROLE_MAP": '{"sre": "root"}'}, "group 'sre' maps to 'root'"),
    ({"GPUSWEEP_OIDC_ROLE_MAP": '{"sre": []}'}, "group 'sre' maps to"),
    ({"GPUSWEEP_OIDC_ROLE_MAP": '["viewer"]'}, "must be a JSON object"),
    ({"GPUSWEEP_OIDC_ROLE_MAP": "{sre: viewer}"}, "not valid JSON"),
    ({"GPUSWEEP_OIDC_CLIENT_SECRET": ""}, "GPUSWEEP_OIDC_CLIENT_SECRET too"),
    ({"GPUSWEEP_OIDC_SCOPES": "email profile"}, "must include openid"),
    ({"GPUSWEEP_OIDC_TOKEN_AUTH": "private_key_jwt"}, "client_secret_basic or client_secret_post"),
    ({"GPUSWEEP_OIDC_ISSUER": "ldap://sso.example.org"}, "scheme 'ldap'"),
])
def test_mistakes_stop_the_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, environ: dict[str, str],
                                 error: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=error):
        load(monkeypatch, tmp_path, **{**SSO, **environ})


def test_the_settings_name_every_role() -> None:
    assert runpy.run_path(str(SETTINGS))["_ROLES"] == tuple(role.value for role in Role)
