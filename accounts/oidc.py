"""Single sign-on through an OpenID provider (mozilla-django-oidc, configured from the environment:
gpusweep/settings.py, "Single sign-on").

What this adds to the library:
- discovery: the provider's endpoints from ``<issuer>/.well-known/openid-configuration``, read at
  the first sign-in and kept an hour (each may be set instead), never at start-up, so the service
  starts while the provider is down and a signed-in user's pages never wait on it;
- the ID token's issuer and audience checked (the library checks neither);
- users matched by the issuer and the `sub` claim (OidcIdentity), never by email or name, so an
  account at the provider never takes over a local account of the same name;
- roles set at every sign-in from the groups claim through GPUSWEEP_OIDC_ROLE_MAP: the user
  holds exactly the mapped roles, so a group removed at the provider loses its role at the next
  sign-in (groups that are not roles are left alone);
- a provider that cannot be reached, or refuses, answers the login page with a message.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, User
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView
from requests.auth import HTTPBasicAuth

from accounts.models import OidcIdentity
from gpusweep.roles import Role

log = logging.getLogger(__name__)

DISCOVERY_TTL_S = 3600.0
# mozilla-django-oidc's endpoint settings -> the discovery document's names.
ENDPOINT_SETTINGS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}
CLOCK_SKEW_S = 60


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read, or lacks what is needed."""


def enabled() -> bool:
    return bool(settings.GPUSWEEP_OIDC_ISSUER)


def provider_name() -> str:
    return settings.GPUSWEEP_OIDC_PROVIDER_NAME or urlsplit(settings.GPUSWEEP_OIDC_ISSUER).hostname or "single sign-on"


_lock = threading.Lock()
_discovered: dict[str, tuple[float, dict[str, Any]]] = {}  # issuer -> (when read, document)


def discovery(configured: str | None = None) -> dict[str, Any]:
    """The provider's discovery document (kept DISCOVERY_TTL_S; a failure is not kept)."""
    wanted: str = configured or settings.GPUSWEEP_OIDC_ISSUER
    with _lock:
        kept = _discovered.get(wanted)
    if kept is not None and time.monotonic() - kept[0] < DISCOVERY_TTL_S:
        return kept[1]
    url = f"{wanted.rstrip('/')}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"could not read {url}: {exc}") from exc
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"{url} is not a JSON object")
    # OpenID Connect Discovery 1.0, 4.3: the document names the issuer it was asked for.
    if str(document.get("issuer", "")).rstrip("/") != wanted.rstrip("/"):
        raise ProviderUnavailable(f"{url} names the issuer {document.get('issuer')!r}, not {wanted!r}")
    with _lock:
        _discovered[wanted] = (time.monotonic(), document)
    return document


def forget_discovery() -> None:
    with _lock:
        _discovered.clear()


def endpoint(name: str) -> str:
    """A provider endpoint by its discovery name: the configured one, else discovered ("" if none)."""
    configured: str | None = settings.GPUSWEEP_OIDC_ENDPOINTS.get(name)
    if configured:
        return configured
    return str(discovery().get(name) or "")


def issuer() -> str:
    """The issuer an ID token must name: the discovery document's spelling when it was read."""
    try:
        return str(discovery()["issuer"])
    except ProviderUnavailable:
        if {"authorization_endpoint", "token_endpoint", "jwks_uri"} <= set(settings.GPUSWEEP_OIDC_ENDPOINTS):
            return str(settings.GPUSWEEP_OIDC_ISSUER)  # every endpoint configured: no discovery needed
        raise


def setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's settings, its endpoints resolved through discovery."""
    if attr in ENDPOINT_SETTINGS:
        found = endpoint(ENDPOINT_SETTINGS[attr])
        if not found and attr != "OIDC_OP_USER_ENDPOINT":
            raise ProviderUnavailable(f"the provider names no {ENDPOINT_SETTINGS[attr]}")
        return found or None
    return import_from_settings(attr, *default)


def mapped_roles(claims: dict[str, Any]) -> set[Role]:
    """The roles the groups claim maps to (a list of names, or one name)."""
    groups = claims.get(settings.GPUSWEEP_OIDC_GROUPS_CLAIM) or []
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list):
        log.warning("claim %s is neither a list nor a string: no role", settings.GPUSWEEP_OIDC_GROUPS_CLAIM)
        return set()
    role_map: dict[str, list[str]] = settings.GPUSWEEP_OIDC_ROLE_MAP
    return {Role(role) for group in groups if isinstance(group, str) for role in role_map.get(group, [])}


def set_roles(user: User, roles: set[Role]) -> None:
    """The user holds exactly `roles` among gpusweep's roles; other groups are left as they are."""
    wanted = {role.value for role in roles}
    held = set(user.groups.filter(name__in=[role.value for role in Role]).values_list("name", flat=True))
    if held - wanted:
        user.groups.remove(*Group.objects.filter(name__in=held - wanted))
    for name in sorted(wanted - held):
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    if hasattr(user, "_gpusweep_roles"):
        del user._gpusweep_roles  # gpusweep.roles.user_roles' per-request copy


_USERNAME_CHARS = re.compile(r"[^\w.@+-]")


def _new_username(claims: dict[str, Any]) -> str:
    """The first configured claim present, made a valid Django username and unique ("-2", "-3" ...)."""
    base = next((str(claims[name]) for name in settings.GPUSWEEP_OIDC_USERNAME_CLAIMS if claims.get(name)),
                str(claims["sub"]))
    base = _USERNAME_CHARS.sub("_", base)[:140] or "user"
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


class OidcBackend(OIDCAuthenticationBackend):
    """Signs in the user of an authorization code (the callback's); nothing else."""

    get_settings = staticmethod(setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__, which resolves every endpoint: Django makes a backend for
        # each request of a signed-in user (get_user), which must not read the provider.
        self.UserModel = get_user_model()

    # Read when a sign-in uses them (discovery), not when the backend is made.
    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: setting("OIDC_OP_TOKEN_ENDPOINT"))
    OIDC_OP_USER_ENDPOINT = property(lambda self: setting("OIDC_OP_USER_ENDPOINT"))
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: setting("OIDC_OP_JWKS_ENDPOINT"))
    OIDC_RP_CLIENT_ID = property(lambda self: settings.OIDC_RP_CLIENT_ID)
    OIDC_RP_CLIENT_SECRET = property(lambda self: settings.OIDC_RP_CLIENT_SECRET)
    OIDC_RP_SIGN_ALGO = property(lambda self: settings.OIDC_RP_SIGN_ALGO)
    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        # Only the callback's call (its nonce and PKCE verifier), never a password form's.
        if not enabled() or request is None or set(kwargs) != {"nonce", "code_verifier"}:
            return None
        user: User | None = super().authenticate(request, **kwargs)
        return user

    def get_token(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The token request; client_secret_basic with the id and secret form-encoded first
        (RFC 6749, 2.3.1), which the library leaves out."""
        auth = None
        if settings.OIDC_TOKEN_USE_BASIC_AUTH:
            auth = HTTPBasicAuth(quote(payload.pop("client_id"), safe=""), quote(payload.pop("client_secret"), safe=""))
        response = requests.post(self.OIDC_OP_TOKEN_ENDPOINT, data=payload, auth=auth,
                                 verify=settings.OIDC_VERIFY_SSL, timeout=settings.OIDC_TIMEOUT)
        self.raise_token_response_error(response)
        answer: dict[str, Any] = response.json()
        return answer

    def _verify_jws(self, payload: bytes | str, key: Any) -> dict[str, Any]:
        """The ID token's signature, and its issuer, audience and lifetime (OpenID Connect Core 3.1.3.7)."""
        try:
            header = jwt.get_unverified_header(payload)
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token unreadable: {exc}") from None
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"ID token signed with {header.get('alg')!r}, not GPUSWEEP_OIDC_SIGN_ALGO="
                                      f"{self.OIDC_RP_SIGN_ALGO!r}")
        try:
            claims: dict[str, Any] = jwt.decode(
                payload, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=self.OIDC_RP_CLIENT_ID,
                issuer=issuer(), leeway=CLOCK_SKEW_S, options={"require": ["iss", "aud", "exp", "iat", "sub"]})
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from None
        return claims

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User | None:
        """The user of the `sub` claim (made at the first sign-in), with its roles set from the groups claim."""
        claims = dict(payload)  # the ID token's claims, then the userinfo endpoint's, when there is one
        if setting("OIDC_OP_USER_ENDPOINT"):
            info = self.get_userinfo(access_token, id_token, payload)
            if info.get("sub") != payload.get("sub"):  # OpenID Connect Core 5.3.2
                raise SuspiciousOperation("the userinfo endpoint answered for another subject")
            claims.update(info)
        subject = str(claims.get("sub") or "")
        if not subject:
            raise SuspiciousOperation("no sub claim")
        with transaction.atomic():
            user = self._user_of(issuer(), subject, claims)
            self.update_user(user, claims)
        return user

    def _user_of(self, at: str, subject: str, claims: dict[str, Any]) -> User:
        found = OidcIdentity.objects.select_related("user").filter(issuer=at, subject=subject).first()
        if found is not None:
            return found.user
        try:
            with transaction.atomic():
                user = User.objects.create_user(_new_username(claims))  # no usable password
                OidcIdentity.objects.create(user=user, issuer=at, subject=subject)
        except IntegrityError:  # the same first sign-in in two tabs at once
            return OidcIdentity.objects.select_related("user").get(issuer=at, subject=subject).user
        log.info("single sign-on: user %s made for %s at %s", user.username, subject, at)
        return user

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        fields = {"email": claims.get("email"), "first_name": claims.get("given_name"),
                  "last_name": claims.get("family_name")}
        changed = [name for name, value in fields.items()
                   if isinstance(value, str) and value[:150] != getattr(user, name)]
        for name in changed:
            setattr(user, name, str(fields[name])[:150])
        if changed:
            user.save(update_fields=changed)
        roles = mapped_roles(claims)
        set_roles(user, roles)
        log.info("single sign-on: %s holds %s", user.username, ", ".join(sorted(roles)) or "no role")
        return user


def _refuse(request: HttpRequest, text: str) -> HttpResponse:
    messages.error(request, text)
    return HttpResponseRedirect(settings.LOGIN_URL)


class AuthenticateView(OIDCAuthenticationRequestView):
    """/accounts/oidc/authenticate/?next=...: off to the provider's authorization endpoint."""

    get_settings = staticmethod(setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)  # endpoints: at the request

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except ProviderUnavailable as exc:
            log.warning("single sign-on: %s", exc)
            return _refuse(request, f"{provider_name()} cannot be reached; try again later.")
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        response: HttpResponse = super().get(request)
        return response


class CallbackView(OIDCAuthenticationCallbackView):
    """/accounts/oidc/callback/: the provider sends the user back here with a code."""

    get_settings = staticmethod(setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("single sign-on is not configured")
        try:
            response: HttpResponse = super().get(request)
        except (ProviderUnavailable, requests.RequestException, SuspiciousOperation) as exc:
            log.warning("single sign-on refused: %s", exc)
            return _refuse(request, f"Signing in with {provider_name()} failed; try again, or ask an admin.")
        return response

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error")
        text = f"{provider_name()} refused the sign-in ({error})." if error else \
            f"Signing in with {provider_name()} failed; try again."
        return _refuse(self.request, text)

    def login_success(self) -> HttpResponse:
        response: HttpResponse = super().login_success()
        if settings.GPUSWEEP_OIDC_SESSION_S:
            self.request.session.set_expiry(settings.GPUSWEEP_OIDC_SESSION_S)
        return response


def end_session_url(request: HttpRequest, id_token: str) -> str:
    """Where logout sends a user who signed in through the provider: its end_session_endpoint
    (RP-Initiated Logout 1.0), back to the login page after; "" when it has none."""
    try:
        found = endpoint("end_session_endpoint")
    except ProviderUnavailable as exc:
        log.warning("single sign-on logout: %s", exc)
        return ""
    if not found:
        return ""
    query = urlencode({"id_token_hint": id_token, "client_id": settings.OIDC_RP_CLIENT_ID,
                       "post_logout_redirect_uri": request.build_absolute_uri(reverse("login"))})
    return f"{found}{'&' if '?' in found else '?'}{query}"
