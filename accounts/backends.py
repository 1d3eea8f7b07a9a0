"""Passwords when local accounts are switched off (GPUSWEEP_LOCAL_LOGIN=false)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import User
from django.http import HttpRequest
from django.urls import reverse


class BreakGlassBackend(ModelBackend):
    """Refuses every password but a superuser's typed on the admin site's own login page
    (/admin/login/): the way in while the OpenID provider is down. The console's login form and
    POST /api/v1/token/ refuse them all; API tokens already made keep working."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None,
                     **kwargs: Any) -> User | None:
        if request is None or request.path_info != reverse("admin:login"):
            return None
        user = super().authenticate(request, username=username, password=password, **kwargs)
        return user if user is not None and user.is_superuser else None
