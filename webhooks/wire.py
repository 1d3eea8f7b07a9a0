"""What every webhook body holds, whatever its template: one date format and absolute links.

Dates are RFC 3339 in UTC with `Z` and whole seconds (`2026-12-04T02:24:36Z`), whether they came
as datetimes or as ISO text from a plan or an evidence event; links are absolute under
`GPUSWEEP_BASE_URL`, so a ticket can link back.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any

from django.conf import settings

# An ISO 8601 date and time with an offset or Z, the T or a space between (what isoformat and str() write).
ISO_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})$")
RFC3339_Z = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"


def rfc3339(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # Django stores UTC: a naive value is UTC
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def absolute(path: str) -> str:
    """`path` under the configured base URL; an absolute URL is left as it is."""
    if path.startswith(("http://", "https://")):
        return path
    return f"{settings.GPUSWEEP_BASE_URL}/{path.lstrip('/')}"


def normalize(value: Any) -> Any:
    """JSON-ready `value` with every date and time in one format (dates without a time stay dates)."""
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str) and ISO_DATETIME.match(value):
        try:
            return rfc3339(datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return value
    if isinstance(value, dict):
        return {str(k): (absolute(v) if k == "url" and isinstance(v, str) and v.startswith("/") else normalize(v))
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)  # Decimal, UUID: as text, as json.dumps(default=str) did
