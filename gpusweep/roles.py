"""Roles: viewers read, operators run campaigns, approvers approve them, admins configure.

Roles are Django groups (created by a migration) so that admins manage them in the admin
site; superusers hold every role.
"""

from __future__ import annotations

import enum
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request


class Role(enum.StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


def user_roles(user: AbstractBaseUser | AnonymousUser) -> set[Role]:
    if not user.is_authenticated:
        return set()
    if getattr(user, "is_superuser", False):
        return set(Role)
    cached: set[Role] | None = getattr(user, "_gpusweep_roles", None)
    if cached is None:
        names = set(user.groups.values_list("name", flat=True))  # type: ignore[attr-defined]
        cached = {role for role in Role if role.value in names}
        # Any role implies read access.
        user._gpusweep_roles = cached  # type: ignore[attr-defined]
    return cached


def has_role(user: AbstractBaseUser | AnonymousUser, *roles: Role) -> bool:
    held = user_roles(user)
    return Role.ADMIN in held or bool(held.intersection(roles))


class RolePermission(BasePermission):
    """Reads need any role; writes need one of the view's `write_roles` (admin by default).

    A view may narrow writes per action with `action_roles = {"approve": {Role.APPROVER}}`.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not user or not user.is_authenticated:
            return False
        held = user_roles(user)
        if not held:
            return False
        action = getattr(view, "action", None)
        action_roles: dict[str, set[Role]] = getattr(view, "action_roles", {})
        if action in action_roles:
            allowed = has_role(user, *action_roles[action])
            if not allowed:  # say which role it takes, not DRF's generic refusal (read per request)
                self.message = (f"{str(action).replace('_', ' ')} needs the "
                                f"{' or '.join(sorted(r.value for r in action_roles[action]))} role; "
                                f"yours: {', '.join(sorted(r.value for r in held))}")
            return allowed
        if request.method in SAFE_METHODS:
            return True
        write_roles: set[Role] = getattr(view, "write_roles", {Role.ADMIN})
        return has_role(user, *write_roles)
