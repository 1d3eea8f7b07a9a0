"""Issuing, listing, checking and revoking API tokens (the only writers of ApiToken).

A key is ``gst_`` plus 40 random URL-safe characters; it is returned once by ``issue`` and
only its SHA-256 is kept. ``user_for_key`` is what every authentication path calls: the REST
API (``accounts.authentication``) and the web export URLs (``gpusweep.middleware``).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiToken
from gpusweep.responses import cached
from gpusweep.roles import user_roles

KEY_PREFIX = "gst_"
# last_used_at is written at most this often per token, so a busy client is not a write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_TOKENS_PER_USER = 50


class TokenError(Exception):
    """A refused token request; the message says why."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue(user: User, name: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """A new named token for `user`; returns the row and the key (shown once, never stored)."""
    name = name.strip()
    if not name:
        raise TokenError("name: say what the token is for")
    if expires_at is not None and expires_at <= timezone.now():
        raise TokenError("expires_at: must be in the future")
    key = KEY_PREFIX + secrets.token_urlsafe(30)
    with transaction.atomic():
        live = ApiToken.objects.select_for_update().filter(user=user, revoked_at__isnull=True)
        if len(live) >= MAX_TOKENS_PER_USER:
            raise TokenError(f"at most {MAX_TOKENS_PER_USER} live tokens per user: revoke one first")
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(user=user, name=name[:100], prefix=key[:12], key_hash=hash_key(key),
                                                expires_at=expires_at)
        except IntegrityError:
            raise TokenError(f"name: you already have a token named {name!r}") from None
    return token, key


def revoke(user: User, token_id: int) -> ApiToken:
    """Revoke one of `user`'s own tokens (idempotent: revoking twice keeps the first time)."""
    ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise TokenError("no such token")  # someone else's token is "no such token" too
    return token


# Every table a token's check reads, its holder's roles included (gpusweep.responses.cached): a
# revocation, a user deactivated or a role taken away is a write to one of them, so it counts at
# the next request.
TOKEN_TABLES = ("accounts_apitoken", "auth_user", "auth_user_groups", "auth_group")


def _live_token(key_hash: str) -> tuple[ApiToken | None, datetime | None]:
    # The password hash stays out of the cache; a token request never reads it.
    token = ApiToken.objects.select_related("user").defer("user__password").filter(
        key_hash=key_hash, revoked_at__isnull=True).first()
    if token is None:
        return None, timezone.now()  # an unknown key is not kept (no cache entry per guess)
    user_roles(token.user)  # read once and kept on the user with it
    return token, None


def user_for_key(key: str) -> tuple[User, ApiToken] | None:
    """The active user a live, unexpired key belongs to, stamping its last use; else None."""
    if not key.startswith(KEY_PREFIX) or len(key) > 200:
        return None
    digest = hash_key(key)
    token = cached(f"token:{digest}", TOKEN_TABLES, lambda: _live_token(digest))
    now = timezone.now()
    if token is None or not token.user.is_active or (token.expires_at is not None and token.expires_at <= now):
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        # A write of accounts_apitoken: the next request reads the token again.
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token.user, token
