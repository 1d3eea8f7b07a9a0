"""Liveness and readiness probes.

/healthz says the process answers. /readyz says the service can do its work: the database
answers a query, the broker accepts a connection, and at least one Celery worker answers a
ping within GPUSWEEP_READYZ_PING_TIMEOUT (2 s by default).

Both are open (load balancers call them), so /readyz tells anyone only "ready" or which check
failed; the details (database vendor, broker transport, worker names, errors, timings) are for
staff: a logged-in staff user or an API token of one.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from gpusweep.celery import app as celery_app


def _check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"ok": True, "vendor": connection.vendor}


def _check_broker() -> dict[str, Any]:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
        transport = conn.transport_cls
    return {"ok": True, "transport": str(transport)}


def _check_workers() -> dict[str, Any]:
    # limit=1: answer as soon as one worker replies instead of waiting out the timeout.
    replies = celery_app.control.ping(timeout=settings.GPUSWEEP_READYZ_PING_TIMEOUT, limit=1)
    workers = sorted(name for reply in replies or [] for name in reply)
    return {"ok": bool(workers), "workers": workers}


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _is_staff(request: HttpRequest) -> bool:
    if getattr(request.user, "is_staff", False):
        return True
    try:
        found = TokenAuthentication().authenticate(Request(request))
    except AuthenticationFailed:
        return False
    return found is not None and bool(getattr(found[0], "is_staff", False))


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, dict[str, Any]] = {}
    for name, check in (("database", _check_database), ("broker", _check_broker), ("workers", _check_workers)):
        started = time.monotonic()
        try:
            result = check()
        except Exception as exc:  # noqa: BLE001 - a probe reports every failure, never raises
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result["ms"] = round((time.monotonic() - started) * 1000, 1)
        checks[name] = result
        if not result["ok"]:
            # Later checks depend on earlier ones; stop at the first failure to answer fast.
            break
    ready = all(c["ok"] for c in checks.values()) and len(checks) == 3
    body: dict[str, Any] = {"status": "ready" if ready else "not ready"}
    if not ready:
        body["failed"] = next(name for name, c in checks.items() if not c["ok"])
    if _is_staff(request):
        body["checks"] = checks
    return JsonResponse(body, status=200 if ready else 503)
