from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from gpusweep.roles import Role

# The requester of a campaign may never approve it, so the demo needs a second person.
DEMO_USERS: list[tuple[str, bool, list[Role]]] = [
    ("admin", True, list(Role)),
    ("approver", False, [Role.VIEWER, Role.APPROVER]),
]


class Command(BaseCommand):
    help = "Create the demo administrator (and a demo approver) on first run and print their passwords once."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        created: list[tuple[str, str]] = []
        for username, superuser, roles in DEMO_USERS:
            if user_model.objects.filter(username=username).exists():
                continue
            password = secrets.token_urlsafe(12)
            if superuser:
                user = user_model.objects.create_superuser(username=username, email="", password=password)
            else:
                user = user_model.objects.create_user(username=username, password=password)
            user.groups.set(Group.objects.filter(name__in=[role.value for role in roles]))
            created.append((username, password))
        if not created:
            self.stdout.write(
                "Demo users: admin and approver (passwords were printed on first run; reset one with: "
                ".venv/bin/python manage.py changepassword admin)"
            )
            return
        banner = "=" * 64
        lines = [banner, "Demo users created (the requester of a campaign cannot approve it, hence two):"]
        lines += [f"  username: {name}    password: {password}" for name, password in created]
        lines += ["These passwords are shown only once.", banner]
        self.stdout.write(self.style.SUCCESS("\n".join(lines)))
