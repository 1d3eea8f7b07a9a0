from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client


@pytest.mark.django_db
def test_it_redirects_anonymous_users_to_the_login_page(client: Client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert client.get("/admin/").status_code == 302


@pytest.mark.django_db
def test_it_refuses_the_api_to_anonymous_users(client: Client):
    assert client.get("/api/v1/").status_code in (401, 403)


@pytest.mark.django_db
def test_healthz_is_open_and_says_ok(client: Client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_it_creates_the_four_roles():
    assert set(Group.objects.values_list("name", flat=True)) >= {"viewer", "operator", "approver", "admin"}


@pytest.mark.django_db
def test_a_user_without_a_role_cannot_read_the_api(client: Client):
    User.objects.create_user("nobody", password="pw-nobody-123")
    client.login(username="nobody", password="pw-nobody-123")
    assert client.get("/api/v1/").status_code == 403


@pytest.mark.django_db
def test_a_viewer_sees_the_overview(client: Client):
    user = User.objects.create_user("vera", password="pw-vera-12345")
    user.groups.add(Group.objects.get(name="viewer"))
    client.login(username="vera", password="pw-vera-12345")
    response = client.get("/")
    assert response.status_code == 200
    assert b"viewer" in response.content
    assert client.get("/api/v1/").status_code == 200


@pytest.mark.django_db
def test_the_demo_users_are_created_once_with_printed_passwords(capsys):
    from django.core.management import call_command

    call_command("ensure_demo_admin")
    first = capsys.readouterr().out
    passwords = dict(
        (line.split()[1], line.split()[3]) for line in first.splitlines() if line.strip().startswith("username:")
    )
    assert set(passwords) == {"admin", "approver"}
    assert Client().login(username="admin", password=passwords["admin"])
    assert Client().login(username="approver", password=passwords["approver"])
    assert User.objects.get(username="admin").is_superuser
    approver = User.objects.get(username="approver")
    assert set(approver.groups.values_list("name", flat=True)) == {"viewer", "approver"}
    call_command("ensure_demo_admin")
    assert "password:" not in capsys.readouterr().out
