"""One error format for the whole API, for every 4xx and 5xx:

    {"detail": "<what went wrong, one sentence>", "errors": {"<field>": ["<message>", ...]}}

``errors`` is present only when input was refused field by field (400); nested fields are named
with dots and list positions (``windows[0].start``). DRF views answer it through
``exception_handler``; everything Django answers itself under /api/ (an unknown URL, a body over
the upload limit, a server error, a debug page) is rewritten into it by ``ApiErrorMiddleware``,
which also refuses what no view should see: a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413; DRF
streams JSON bodies past Django's own check) and NUL characters in the path or query (400;
PostgreSQL cannot store them and would fail the request with a server error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig, SuspiciousOperation
from django.db.models import ProtectedError, RestrictedError
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

log = logging.getLogger(__name__)
API_PREFIX = "/api/"


def error_body(detail: str, errors: dict[str, list[str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"detail": detail}
    if errors:
        body["errors"] = errors
    return body


def error_response(status: int, detail: str, errors: dict[str, list[str]] | None = None) -> JsonResponse:
    """The API's error format for code outside DRF views (middleware, plain Django views)."""
    return JsonResponse(error_body(detail, errors), status=status)


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as {"field.sub[0]": [messages]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = str(key) if not prefix else f"{prefix}.{key}"
            for field, messages in flatten_errors(value, name).items():
                out.setdefault(field, []).extend(messages)
    elif isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            out[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                if not item:
                    continue  # DRF puts {} for the valid items of a list
                nested = flatten_errors(item, f"{prefix}[{index}]")
                for field, messages in nested.items():
                    out.setdefault(field, []).extend(messages)
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def _summary(errors: dict[str, list[str]]) -> str:
    field, messages = next(iter(errors.items()))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    where = "" if field == "non_field_errors" else f"{field}: "
    return f"Invalid input: {where}{messages[0]}{more}"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, answering the one format; input too deep to process is the client's error."""
    if isinstance(exc, ObjectDoesNotExist):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, RecursionError):
        # Raised while validating input nested beyond what the parsers let through (a form field
        # holding JSON, say): the request is refused, the worker is fine.
        exc = exceptions.ValidationError({"non_field_errors": ["input is nested too deeply"]})
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, ProtectedError | RestrictedError):
        # Checked before anything is deleted: the object stays, and the answer says what holds it.
        held_by = sorted({str(type(obj)._meta.verbose_name_plural) for obj in exc.args[1]})
        exc = Conflict(f"cannot delete: still referenced by {', '.join(held_by) or 'other rows'}")
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = flatten_errors(exc.detail)
        response.data = error_body(_summary(errors) if errors else "Invalid input.", errors)
    elif isinstance(response.data, dict) and "detail" in response.data:
        response.data = error_body(str(response.data["detail"]))
    else:
        response.data = error_body(str(response.data))
    return response


class Conflict(exceptions.APIException):
    status_code = HTTPStatus.CONFLICT
    default_detail = "Conflicts with the object's state."
    default_code = "conflict"


class PayloadTooLarge(exceptions.APIException):
    status_code = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "too_large"


def max_body_bytes() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440)


class ApiErrorMiddleware:
    """Under /api/: refuse oversized bodies and NUL characters up front, and answer every error
    Django produces itself in the API's format instead of an HTML page."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        refused = self._refuse(request)
        if refused is not None:
            return refused
        response = self.get_response(request)
        if response.status_code >= 400 and not response.get("Content-Type", "").startswith("application/json"):
            return self._as_json(response)
        return response

    def _refuse(self, request: HttpRequest) -> HttpResponse | None:
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            return error_response(400, f"Content-Length {raw_length[:40]!r} is not a number")
        if length < 0:
            return error_response(400, "Content-Length must not be negative")
        if length > max_body_bytes():
            return error_response(413, f"Request body too large: {length} bytes, the limit is {max_body_bytes()}")
        raw_path = request.META.get("PATH_INFO", "")
        query = request.META.get("QUERY_STRING", "")
        if "\x00" in raw_path or b"\x00" in unquote_to_bytes(query):
            return error_response(400, "NUL characters are not allowed in the path or query")
        return None

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """Exceptions a view leaves to Django (a plain view reading an oversized body, say)."""
        if not request.path.startswith(API_PREFIX):
            return None
        if isinstance(exc, RequestDataTooBig):
            return error_response(413, f"Request body too large: the limit is {max_body_bytes()} bytes")
        if isinstance(exc, SuspiciousOperation):
            return error_response(400, str(exc) or "Bad request")
        if isinstance(exc, RecursionError):
            return error_response(400, "input is nested too deeply")
        return None

    @staticmethod
    def _as_json(response: HttpResponse) -> HttpResponse:
        status = response.status_code
        if status >= 500:
            detail = "Server error: the failure is logged; the request may be retried later."
        else:
            try:
                detail = HTTPStatus(status).phrase
            except ValueError:
                detail = "Error"
        replaced = error_response(status, detail)
        for header in ("Allow", "WWW-Authenticate", "Retry-After"):
            if header in response:
                replaced[header] = response[header]
        return replaced
