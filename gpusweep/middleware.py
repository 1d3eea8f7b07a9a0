from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse

# Probes and login are the only open pages; the API and its schema authenticate themselves (DRF
# answers 401/403), and so does /metrics (its bearer token). The API docs page is a page: without
# a login it redirects to the login form.
OPEN_PREFIXES = ("/healthz", "/readyz", "/metrics", "/accounts/login/", "/static/", "/admin/login/")
DOCS_PREFIX = "/api/docs/"


class LoginRequiredMiddleware:
    """Nothing is anonymous: every page but the open ones needs a login.

    The REST API answers 401/403 itself (DRF); pages redirect to the login form.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path
        if path.startswith(OPEN_PREFIXES) or (path.startswith("/api/") and not path.startswith(DOCS_PREFIX)):
            return self.get_response(request)
        if not request.user.is_authenticated:
            if request.headers.get("Accept", "").startswith("application/json"):
                return JsonResponse({"detail": "Authentication required."}, status=401)
            return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
        return self.get_response(request)
