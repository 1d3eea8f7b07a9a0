"""GET /metrics: the Prometheus text format, for a scraper holding GPUSWEEP_METRICS_TOKEN.

A bearer token rather than a bind address of its own: every web process (gunicorn workers behind
one port) reads the same database, so any of them answers a scrape, and the token works through
the same load balancer and TLS as the rest of the service. Unset, the endpoint answers 404:
nothing is exposed anonymously.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import CollectorRegistry

from gpusweep.errors import error_response
from metrics.collect import DatabaseCollector


def authorized(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.GPUSWEEP_METRICS_TOKEN
    if not token:
        return error_response(404, "metrics are off: set GPUSWEEP_METRICS_TOKEN")
    if not authorized(request, token):
        response = error_response(401, "send Authorization: Bearer <GPUSWEEP_METRICS_TOKEN>")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    # A registry per scrape: nothing is kept in this process between scrapes.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    # The 0.0.4 text format every Prometheus 2.x reads (all names here are plain ASCII).
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
