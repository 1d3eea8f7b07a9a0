from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from tests.browser import page  # noqa: F401  (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_logs_a_viewer_in_and_shows_the_overview(page, live_server):  # noqa: F811
    user = User.objects.create_user("vera", password="pw-vera-12345")
    user.groups.add(Group.objects.get(name="viewer"))

    page.goto(f"{live_server.url}/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", "vera")
    page.fill("input[name=password]", "pw-vera-12345")
    page.click("button[type=submit]")
    page.wait_for_selector("h1:has-text('Overview')")
    assert "viewer" in page.inner_text("main")
    assert page.inner_text("header").count("vera") == 1


def test_it_rejects_a_wrong_password(page, live_server):  # noqa: F811
    User.objects.create_user("vera", password="pw-vera-12345")
    page.goto(f"{live_server.url}/accounts/login/")
    page.fill("input[name=username]", "vera")
    page.fill("input[name=password]", "wrong")
    page.click("button[type=submit]")
    assert "didn't match" in page.inner_text("main")
