"""The FilterSet every API filter derives from: integer filters bounded by the database's range.

django-filter's NumberFilter takes any decimal (``?cluster_id=-2.7e218``) and hands it to the
database, which fails the query (a server error). Here an integer column is filtered by a whole
number within the column's range, or the request is refused with 400.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import django_filters
from django import forms
from django.db import connection, models
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


DEFAULTS = deepcopy(FILTER_FOR_DBFIELD_DEFAULTS)
DEFAULTS.update({kind: {"filter_class": IntegerFilter, "extra": _integer_defaults} for kind in INTEGER_FIELDS})


class FilterSet(DRFFilterSet):
    FILTER_DEFAULTS = DEFAULTS


class FilterBackend(DjangoFilterBackend):
    """Filters generated from a view's ``filterset_fields`` use the bounded FilterSet too."""

    filterset_base = FilterSet
