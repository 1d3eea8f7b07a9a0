"""From an advisory's public id (`nvidia-5703`, what the API, URLs and webhooks carry) back to its row."""

from __future__ import annotations

from advisories.models import Advisory, public_id


def resolve(value: str) -> Advisory | None:
    """The advisory whose public id is `value` (case-insensitive), or None."""
    wanted = value.strip().lower()
    _name, _, rest = wanted.partition("-")
    if not rest:
        return None
    candidates = list(Advisory.objects.filter(publisher_id__iexact=rest))
    if not candidates:  # a bulletin id whose characters the slug replaced: compare every one's slug
        candidates = list(Advisory.objects.all())
    return next((a for a in candidates if public_id(a.publisher, a.publisher_id) == wanted), None)


def resolve_all(values: list[str]) -> tuple[list[Advisory], list[str]]:
    """(the advisories found, the values that name none)."""
    found: list[Advisory] = []
    unknown: list[str] = []
    for value in values:
        advisory = resolve(str(value))
        if advisory is None:
            unknown.append(str(value))
        else:
            found.append(advisory)
    return found, unknown
