"""From an advisory's public id (`nvidia-5703`, what the API, URLs and webhooks carry) back to its row."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from django_filters.constants import EMPTY_VALUES
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

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


HELP = "an advisory's public id, e.g. nvidia-5703 (400 when no advisory has it)"


class PublicAdvisoryFilter(django_filters.CharFilter):
    """`?advisory=<public id>`: an unknown one is a 400, never a silently empty list."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", HELP)
        super().__init__(*args, **kwargs)

    def filter(self, qs: QuerySet[Any], value: Any) -> QuerySet[Any]:
        if value in EMPTY_VALUES:
            return qs
        advisory = resolve(str(value))
        if advisory is None:
            raise ValidationError({"advisory": [f"no advisory {value!r}: advisories are named by their public id, "
                                                "e.g. nvidia-5703"]})
        return qs.filter(**{self.field_name: advisory.pk}).distinct()


@extend_schema_field({"type": "string", "description": HELP, "example": "nvidia-5703"})
class PublicAdvisoryField(serializers.RelatedField):
    """An advisory as its public id, read and written (a campaign's `advisories: ["nvidia-5703"]`)."""

    def __init__(self, **kwargs: Any) -> None:
        if not kwargs.get("read_only"):
            kwargs.setdefault("queryset", Advisory.objects.all())
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> str:
        return str(value.public_id)

    def to_internal_value(self, data: Any) -> Advisory:
        advisory = resolve(data) if isinstance(data, str) else None
        if advisory is None:
            raise ValidationError(f"no advisory {data!r}: advisories are named by their public id, e.g. nvidia-5703")
        return advisory
