"""JSON input with bounds: the API's parser and the agent heartbeat read JSON through ``load_json``.

A document nested deeper than MAX_JSON_DEPTH is refused before any serializer walks it (a
recursive walk of ~1,000 levels is a RecursionError, a server error). Strings holding a NUL
character are refused too: PostgreSQL cannot store them in text or jsonb.

The API takes JSON bodies only. Form media types are accepted when the body is empty (a POST
of an action without parameters from a client that labels every body a form): a form field
that holds JSON would bypass every bound above, and a form "null" would reach NOT NULL columns.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import BaseParser
from rest_framework.parsers import JSONParser as DRFJSONParser

# Deep enough for every document the API takes (a campaign's windows, a heartbeat: 4 levels).
MAX_JSON_DEPTH = 32


class JSONInputError(ValueError):
    """The body is not JSON the service accepts; the message says why."""


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise JSONInputError for a document nested deeper than `max_depth`, holding a NUL or an
    infinite number."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise JSONInputError("strings must not contain NUL characters")
            continue
        if isinstance(item, float) and not math.isfinite(item):
            raise JSONInputError("numbers must be finite (1e400 is not)")
        if not isinstance(item, dict | list):
            continue
        if depth > max_depth:
            raise JSONInputError(f"JSON nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key:
                    raise JSONInputError("keys must not contain NUL characters")
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in item)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads within the bounds above; NaN and Infinity are refused (PostgreSQL's jsonb has none)."""
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise JSONInputError(f"JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise JSONInputError(f"not JSON: {exc}") from None
    check_json(value, max_depth)
    return value


class JSONParser(DRFJSONParser):
    """DRF's JSON parser, bounded (depth, NUL) and reading at most the upload limit."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
              ) -> Any:
        encoding = str((parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET)
        try:
            "".encode(encoding)  # a text codec; bytes-to-bytes codecs (bz2_codec) would decompress
        except (LookupError, UnicodeError):
            raise ParseError(f"Unsupported charset {encoding!r}") from None
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 2_621_440)
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise ParseError(f"Request body too large: the limit is {limit} bytes")
        try:
            return load_json(raw.decode(encoding))
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        except JSONInputError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def _refuse_form(media_type: str | None) -> UnsupportedMediaType:
    return UnsupportedMediaType(media_type or "", detail="The API takes JSON bodies (Content-Type: application/json); "
                                "a form body is accepted only when empty.")


class EmptyFormParser(BaseParser):
    media_type = "application/x-www-form-urlencoded"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
        if stream is not None and stream.read(4096).strip():
            raise _refuse_form(media_type)
        return {}


class EmptyMultiPartParser(BaseParser):
    media_type = "multipart/form-data"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
              ) -> dict[str, Any]:
        body = stream.read(4096).strip() if stream is not None else b""
        # An empty multipart body is only its closing delimiter: "--<boundary>--".
        if body and not (body.startswith(b"--") and body.endswith(b"--") and b"\n" not in body):
            raise _refuse_form(media_type)
        return {}
