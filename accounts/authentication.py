"""Token authentication for the REST API: ``Authorization: Bearer <key>`` or ``Token <key>``.

Named tokens (``accounts.models.ApiToken``) first; a key made with DRF's own token table
(``rest_framework.authtoken``, one per user, made in the admin) is still accepted under either
keyword, so existing integrations keep working.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.request import Request

from accounts import services

KEYWORDS = ("bearer", "token")


def key_from_header(header: str) -> str | None:
    """The key of an ``Authorization`` header with one of our keywords, else None (not ours)."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() not in KEYWORDS:
        return None
    return parts[1]


def user_for_header(header: str) -> AbstractBaseUser | None:
    """The user a Bearer/Token header authenticates, or None (missing, unknown, expired, revoked)."""
    key = key_from_header(header)
    if key is None:
        return None
    found = services.user_for_key(key)
    if found is not None:
        return found[0]
    legacy = Token.objects.select_related("user").filter(key=key[:40]).first() if len(key) == 40 else None
    if legacy is not None and legacy.user.is_active:
        return legacy.user
    return None


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, Any] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        if key_from_header(header) is None:
            if header.split()[:1] and header.split()[0].lower() in KEYWORDS:
                raise exceptions.AuthenticationFailed("Authorization: Bearer <token> (one token, no spaces)")
            return None  # another scheme: not ours to judge
        user = user_for_header(header)
        if user is None:
            raise exceptions.AuthenticationFailed("invalid, expired or revoked token")
        return user, None

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'
