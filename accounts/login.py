"""The login and logout pages: the provider's button when single sign-on is configured, the
password form while local accounts are on (GPUSWEEP_LOCAL_LOGIN), and a logout that also ends
the session at the provider when it offers an end_session_endpoint."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, HttpResponseRedirect
from django.urls import reverse

from accounts import oidc


class LoginView(auth_views.LoginView):
    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["local_login"] = settings.GPUSWEEP_LOCAL_LOGIN
        if oidc.enabled():
            next_url = context.get("next") or ""
            context["sso_name"] = oidc.provider_name()
            query = f"?{urlencode({'next': next_url})}" if next_url else ""
            context["sso_url"] = reverse("oidc-authenticate") + query
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.GPUSWEEP_LOCAL_LOGIN:
            return HttpResponseForbidden(
                f"403 Forbidden: passwords are switched off here; sign in with {oidc.provider_name()}",
                content_type="text/plain")
        return super().post(request, *args, **kwargs)


class LogoutView(auth_views.LogoutView):
    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        id_token = request.session.get("oidc_id_token") if oidc.enabled() else None
        response = super().post(request, *args, **kwargs)  # the gpusweep session ends here
        if id_token:
            provider_logout = oidc.end_session_url(request, id_token)
            if provider_logout:
                return HttpResponseRedirect(provider_logout)
        return response
