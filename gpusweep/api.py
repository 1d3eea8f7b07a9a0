"""One URL list for the REST API: each app contributes its own router under /api/v1/.

An app opts in by defining ``router`` (a gpusweep.routers.ApiRouter) in its ``api.py``.
"""

from __future__ import annotations

from importlib import import_module

from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.utils import extend_schema
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

API_APPS = ("accounts", "inventory", "advisories", "campaigns", "reports", "webhooks")


def _app_patterns() -> list[URLPattern | URLResolver]:
    patterns: list[URLPattern | URLResolver] = []
    for app in API_APPS:
        try:
            module = import_module(f"{app}.api")
        except ModuleNotFoundError as exc:
            if exc.name != f"{app}.api":
                raise
            continue
        patterns.append(path(f"{app}/", include((module.router.urls, app), namespace=app)))
    return patterns


@extend_schema(exclude=True)  # the index of the app roots; the schema lists every route itself
@api_view(["GET"])
def api_root(request: Request) -> Response:
    return Response({app: reverse("home", request=request).rstrip("/") + f"/api/v1/{app}/" for app in API_APPS})


api_urlpatterns: list[URLPattern | URLResolver] = [path("", api_root, name="api-root"), *_app_patterns()]
