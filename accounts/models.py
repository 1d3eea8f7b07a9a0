"""Named API tokens: several per user, each with its last use and an optional expiry.

Only a SHA-256 of the key is stored, so a database dump holds no usable credential; the key is
shown once, when the token is made. `prefix` (the key's first characters) lets a user tell tokens
apart in a list.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="what the token is for, e.g. 'jira integration'")
    prefix = models.CharField(max_length=12, help_text="the key's first characters, to recognise it")
    key_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the key (hex)")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="empty: never expires")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # A name tells a user's live tokens apart; a revoked token's name may be reused.
            models.UniqueConstraint(fields=["user", "name"], condition=models.Q(revoked_at__isnull=True),
                                    name="accounts_token_live_name_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.prefix}…)"


class OidcIdentity(models.Model):
    """The account at the OpenID provider a user signs in with: the issuer and its `sub` claim,
    never the user's name or email (accounts.oidc). Made at the user's first sign-in."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255, help_text="the provider's `sub` claim")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "single sign-on identity"
        verbose_name_plural = "single sign-on identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="accounts_oidc_identity_unique")]

    def __str__(self) -> str:
        return f"{self.user} = {self.subject} at {self.issuer}"
