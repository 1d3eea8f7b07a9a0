from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the demo administrator on first run and print its password once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        user_model = get_user_model()
        existing = user_model.objects.filter(username=username).first()
        if existing is not None:
            self.stdout.write(
                f"Demo administrator: {username} (password was printed on first run; "
                f"reset it with: .venv/bin/python manage.py changepassword {username})"
            )
            return
        password = secrets.token_urlsafe(12)
        user = user_model.objects.create_superuser(username=username, email="", password=password)
        user.groups.set(Group.objects.filter(name__in=["viewer", "operator", "approver", "admin"]))
        banner = "=" * 64
        lines = [banner, "Demo administrator created.", f"  username: {username}", f"  password: {password}"]
        lines += ["This password is shown only once.", banner]
        self.stdout.write(self.style.SUCCESS("\n".join(lines)))
