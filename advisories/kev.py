"""CISA's Known Exploited Vulnerabilities catalogue: its due dates override the policy."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from django.db import transaction

from advisories.csaf import DocumentError
from advisories.exposure import assign_deadlines
from advisories.http import HttpClient
from advisories.models import KevEntry


def _date(value: object, where: str) -> dt.date:
    if not isinstance(value, str):
        raise DocumentError(where, "date missing or not text")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise DocumentError(where, f"{value!r} is not a YYYY-MM-DD date") from None


def load(location: str, client: HttpClient | None = None) -> bytes:
    if location.startswith(("http://", "https://")):
        response = (client or HttpClient()).get(location)
        assert response is not None
        return response.body
    try:
        return Path(location).read_bytes()
    except OSError as exc:
        raise DocumentError(location, f"cannot read: {exc.strerror}") from None


def import_catalogue(content: bytes, name: str) -> int:
    """Replace the KEV rows with the catalogue's; all or nothing. Returns the number of entries."""
    try:
        data = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DocumentError(name, f"invalid JSON: {exc}") from None
    rows = data.get("vulnerabilities") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise DocumentError(name, "a KEV catalogue holds a 'vulnerabilities' list")
    entries: dict[str, KevEntry] = {}
    for i, row in enumerate(rows):
        where = f"{name} vulnerabilities[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("cveID"), str):
            raise DocumentError(where, "missing cveID")
        cve_id = row["cveID"].strip().upper()
        entries[cve_id] = KevEntry(
            cve_id=cve_id, name=str(row.get("vulnerabilityName", ""))[:300],
            date_added=_date(row["dateAdded"], where) if row.get("dateAdded") else None,
            due_date=_date(row.get("dueDate"), where),
        )
    with transaction.atomic():
        KevEntry.objects.exclude(cve_id__in=entries).delete()
        KevEntry.objects.bulk_create(
            entries.values(), update_conflicts=True, unique_fields=["cve_id"],
            update_fields=["name", "date_added", "due_date"],
        )
        assign_deadlines(refresh=True)
    return len(entries)
