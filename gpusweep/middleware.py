from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string

from gpusweep.roles import user_roles

# Probes and login (with single sign-on's two steps) are the only open pages; the API and its schema
# authenticate themselves (DRF answers 401/403), and so does /metrics (its bearer token). The API
# docs page is a page: without a login it redirects to the login form.
OPEN_PREFIXES = ("/healthz", "/readyz", "/metrics", "/accounts/login/", "/accounts/oidc/", "/static/", "/admin/login/",
                 "/favicon.ico")
DOCS_PREFIX = "/api/docs/"
# Pages a logged-in user without a role may still reach: their own login session (log out, change
# password) and the admin site, which checks is_staff itself. Every other page needs a role, as the
# API does (issue 28 item 4).
ROLELESS_PREFIXES = ("/accounts/", "/admin/")

View = TypeVar("View", bound=Callable[..., Any])


def accepts_token(view: View) -> View:
    """Mark a page as a download a script may fetch with ``Authorization: Bearer <key>`` (or
    ``Token``) instead of a session: exports and reports. Other pages need a login session."""
    view.accepts_token = True  # type: ignore[attr-defined]
    return view


def _token_user(request: HttpRequest) -> Any:
    header = request.headers.get("Authorization", "")
    if not header or request.method not in ("GET", "HEAD"):
        return None
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return None
    if not getattr(match.func, "accepts_token", False):
        return None
    return import_string(settings.GPUSWEEP_TOKEN_USER)(header)


class LoginRequiredMiddleware:
    """Nothing is anonymous: every page but the open ones needs a login.

    The REST API answers 401/403 itself (DRF); pages redirect to the login form. A page marked
    ``accepts_token`` (an export) also takes an API token, for that request only (no session).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path.startswith(OPEN_PREFIXES) or (path.startswith("/api/") and not path.startswith(DOCS_PREFIX)):
            return self.get_response(request)
        if not request.user.is_authenticated:
            token_user = _token_user(request)
            if token_user is not None:
                request.user = token_user
                return self.get_response(request) if user_roles(token_user) else _no_role(request)
            if request.headers.get("Authorization"):
                return JsonResponse({"detail": "invalid, expired or revoked token (or this page takes a login)"},
                                    status=401)
            if request.headers.get("Accept", "").startswith("application/json"):
                return JsonResponse({"detail": "Authentication required."}, status=401)
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        if not path.startswith(ROLELESS_PREFIXES) and not user_roles(request.user):
            return _no_role(request)
        return self.get_response(request)


def _no_role(request: HttpRequest) -> HttpResponse:
    detail = "your account holds no role (viewer, operator, approver or admin): ask an admin for one"
    if request.headers.get("Accept", "").startswith("application/json") or request.headers.get("Authorization"):
        return JsonResponse({"detail": detail}, status=403)
    return HttpResponseForbidden(f"403 Forbidden: {detail}", content_type="text/plain")
