"""The FilterSet every API filter derives from: integers and times the database can compare.

django-filter's NumberFilter takes any decimal (``?cluster_id=-2.7e218``) and hands it to the
database, which fails the query (a server error). Here an integer column is filtered by a whole
number within the column's range, or the request is refused with 400. Times are compared in
UTC: PostgreSQL refuses offsets beyond ±15:59 (``-18:07`` parses in Python), and a time near
year 1 or 9999 may not exist in UTC at all (400 too).
"""

from __future__ import annotations

import datetime as dt
from copy import deepcopy
from typing import Any

import django_filters
from django import forms
from django.db import connection, models
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.rest_framework import FilterSet as DRFFilterSet
from django_filters.rest_framework.filterset import FILTER_FOR_DBFIELD_DEFAULTS

INTEGER_FIELDS = (
    models.AutoField, models.BigAutoField, models.SmallAutoField, models.SmallIntegerField, models.IntegerField,
    models.BigIntegerField, models.PositiveIntegerField, models.PositiveSmallIntegerField,
    models.PositiveBigIntegerField,
)


def integer_range(internal_type: str) -> tuple[int, int]:
    low, high = connection.ops.integer_field_range(internal_type)
    # SQLite reports no bounds; its integers are 64-bit.
    return (-(2**63) if low is None else low, 2**63 - 1 if high is None else high)


class IntegerFilter(django_filters.NumberFilter):
    """A whole number within [min_value, max_value] (the 64-bit range unless told)."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, min_value: int = -(2**63), max_value: int = 2**63 - 1, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", min_value)
        kwargs.setdefault("max_value", max_value)
        super().__init__(*args, **kwargs)


def _integer_defaults(field: models.Field[Any, Any]) -> dict[str, int]:
    low, high = integer_range(field.get_internal_type())
    return {"min_value": low, "max_value": high}


class UTCDateTimeField(IsoDateTimeField):
    def to_python(self, value: Any) -> dt.datetime | None:
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(dt.UTC)
        except OverflowError:
            raise forms.ValidationError("not a time that exists in UTC", code="invalid") from None


class DateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 time, compared in UTC."""

    field_class = UTCDateTimeField


DEFAULTS = deepcopy(FILTER_FOR_DBFIELD_DEFAULTS)
DEFAULTS.update({kind: {"filter_class": IntegerFilter, "extra": _integer_defaults} for kind in INTEGER_FIELDS})
DEFAULTS[models.DateTimeField] = {"filter_class": DateTimeFilter}


class FilterSet(DRFFilterSet):
    FILTER_DEFAULTS = DEFAULTS


class FilterBackend(DjangoFilterBackend):
    """Filters generated from a view's ``filterset_fields`` use the bounded FilterSet too."""

    filterset_base = FilterSet
