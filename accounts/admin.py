from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from accounts.models import OidcIdentity


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):
    """Made at a user's first sign-in through the provider; deleting one makes the next sign-in of
    that subject a new user."""

    list_display = ("user", "subject", "issuer", "created_at")
    search_fields = ("user__username", "subject")
    readonly_fields = ("user", "issuer", "subject", "created_at")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
