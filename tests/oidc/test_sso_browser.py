"""Single sign-on in a real browser (Debian's Chromium) against the real test provider: the login
page's button, the provider's own login form, the console, and logout through the provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from accounts import oidc
from gpusweep.roles import Role, user_roles
from tests.browser import page  # noqa: F401  (fixture)
from tests.oidc.idp import running

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

USERS = {"alice": {"password": "alice-pw-1", "sub": "0c6f0c7e-alice", "email": "alice@example.test",
                   "groups": ["sec-viewers", "sre"]}}


def test_a_user_signs_in_with_the_provider_and_out_again(page: Any, live_server: Any, settings: Any,  # noqa: F811
                                                         tmp_path: Path) -> None:
    with running(tmp_path, USERS, [live_server.url]) as provider:
        oidc.forget_discovery()
        for name, value in provider.settings(GPUSWEEP_LOCAL_LOGIN=False, AUTHENTICATION_BACKENDS=[
                "accounts.backends.BreakGlassBackend", "accounts.oidc.OidcBackend"]).items():
            setattr(settings, name, value)

        page.goto(f"{live_server.url}/nodes/")
        assert "/accounts/login/" in page.url
        assert page.locator("input[name=password]").count() == 0  # local accounts are off
        page.click("text=Sign in with Test IdP")
        page.wait_for_selector("h1:has-text('Test IdP')")
        assert page.url.startswith(provider.issuer)
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", "alice-pw-1")
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/nodes/")
        assert page.inner_text("header").count("alice") == 1
        assert user_roles(User.objects.get(username="alice")) == {Role.VIEWER, Role.OPERATOR}

        page.click("header button:has-text('Log out')")
        page.wait_for_url(f"{provider.issuer}/session/end*")
        page.click("button:has-text('Yes, sign me out')")
        page.wait_for_url(f"{live_server.url}/accounts/login/")
        page.goto(f"{live_server.url}/nodes/")
        assert "/accounts/login/" in page.url
