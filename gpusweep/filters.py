"""The FilterSet every API filter derives from: integers, times and booleans the database can compare,
and the one check that refuses query parameters a view does not know.

django-filter's NumberFilter takes any decimal (``?cluster_id=-2.7e218``) and hands it to the
database, which fails the query (a server error). Here an integer column is filtered by a whole
number within the column's range, or the request is refused with 400. Times are compared in
UTC: PostgreSQL refuses offsets beyond ±15:59 (``-18:07`` parses in Python), and a time near
year 1 or 9999 may not exist in UTC at all (400 too). A boolean is true/false, 1/0, yes/no or
on/off in any case; anything else is a 400 (django-filter's own took only true/false and silently
ignored ``?overdue=1``, the UI's own link).

Every list and detail route goes through ``FilterBackend``, which refuses a query parameter that
is no filter of the view, nor ``limit``/``offset``/``cursor``/``ordering``/``format``, nor ``search`` where the
view searches, nor one of the view's ``extra_query_params`` for the action: a misspelt filter is
a 400 naming the ones that exist, never a silently unfiltered list. ``OrderingFilter`` refuses an
unknown ordering term the same way.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections import OrderedDict
from copy import deepcopy
from typing import Any

import django_filters
from django import forms
from django.db import connection, models
from django.http import QueryDict
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.rest_framework import FilterSet as DRFFilterSet
from django_filters.rest_framework.filterset import FILTER_FOR_DBFIELD_DEFAULTS
from rest_framework import filters as drf_filters
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

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


TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})
BOOLEAN_HELP = "true or false (also 1/0, yes/no, on/off)"


def parse_bool(value: Any) -> bool | None:
    """None for empty; True/False for the usual spellings; ValueError for anything else."""
    if value is None or value == "" or isinstance(value, bool):
        return value if isinstance(value, bool) else None
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(BOOLEAN_HELP)


class StrictBooleanField(forms.Field):
    widget = forms.TextInput

    def to_python(self, value: Any) -> bool | None:
        try:
            return parse_bool(value)
        except ValueError:
            # The value goes in params: django-filter %-formats the message (a "%" in the value broke it).
            raise forms.ValidationError("%(value)s is not a boolean: %(help)s", code="invalid",
                                        params={"value": repr(str(value)[:40]), "help": BOOLEAN_HELP}) from None

    def validate(self, value: Any) -> None:
        if value is None and self.required:
            raise forms.ValidationError(self.error_messages["required"], code="required")


class BooleanFilter(django_filters.BooleanFilter):
    """true/false/1/0/yes/no/on/off; anything else refused (400)."""

    field_class = StrictBooleanField


class MultipleChoiceFilter(django_filters.MultipleChoiceFilter):
    """Any of several values of one column. No DISTINCT unless asked (django-filter adds one by default,
    which made a filtered list's count and page two sorts of every matching row)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("distinct", False)
        super().__init__(*args, **kwargs)


DEFAULTS = deepcopy(FILTER_FOR_DBFIELD_DEFAULTS)
DEFAULTS.update({kind: {"filter_class": IntegerFilter, "extra": _integer_defaults} for kind in INTEGER_FIELDS})
DEFAULTS[models.DateTimeField] = {"filter_class": DateTimeFilter}
DEFAULTS[models.BooleanField] = {"filter_class": BooleanFilter}


class FilterSet(DRFFilterSet):
    """django-filter's FilterSet, made per request from copies that share what never changes.

    django-filter deep-copies every filter on each request and builds its form class and form
    fields anew: about 1.5 ms of CPU per list request (a fifth of an uncached page). A filter's
    form field and the form class depend only on the FilterSet class and the model, so they are
    built once per class; each request gets shallow copies of the filters (their own `model` and
    `parent`, a method filter bound to its copy) and a form of its own (Django's Form copies the
    fields it binds)."""

    FILTER_DEFAULTS = DEFAULTS

    def __init__(self, data: Any = None, queryset: Any = None, *, request: Any = None, prefix: Any = None) -> None:
        if queryset is None:
            queryset = self._meta.model._default_manager.all()
        model = queryset.model
        self.is_bound = data is not None
        self.data = data or QueryDict()
        self.queryset = queryset
        self.request = request
        self.form_prefix = prefix
        self.filters = OrderedDict((name, _copy_filter(base, model, self)) for name, base in self.base_filters.items())

    def get_form_class(self) -> type[forms.Form]:
        # The fields are the base filters' own (built once, _copy_filter): the class is too.
        key = (type(self), self._meta.model)
        found = _FORM_CLASSES.get(key)
        if found is None:
            found = super().get_form_class()
            found.base_fields = _SharedFields(found.base_fields)
            _FORM_CLASSES[key] = found
        return found


_FORM_CLASSES: dict[tuple[type, Any], type[forms.Form]] = {}


class _SharedFields(dict[str, forms.Field]):
    """A filter form's fields: each form gets shallow copies sharing their widgets and choices.
    Django's Form deep-copies its fields (choices, widgets) per instance, for forms that change
    them while rendering; a filter form only validates the query string."""

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, forms.Field]:
        return {name: copy.copy(field) for name, field in self.items()}


def _copy_filter(base: django_filters.Filter, model: Any, parent: FilterSet) -> django_filters.Filter:
    """A request's filter: a shallow copy of the class's filter, whose form field it shares."""
    if getattr(base, "model", None) is not model:  # the label (and so the field) is the model's
        base.model = model
        base.__dict__.pop("_field", None)
    base.field  # noqa: B018  # built once per class; the copies share it (gthread: a race builds an equal one)
    copied = copy.copy(base)
    copied.model = model
    copied.parent = parent
    if copied._method is not None:  # a method filter calls through its filter's parent: bind the copy
        copied.method = copied._method
    return copied


# Parameters every list understands: pagination, ordering and DRF's renderer override.
COMMON_PARAMS = frozenset({"limit", "offset", "cursor", "ordering", "format"})


def known_params(view: Any, filterset_class: type[django_filters.FilterSet] | None) -> set[str]:
    known = set(COMMON_PARAMS)
    if filterset_class is not None:
        known.update(filterset_class.base_filters)
    if getattr(view, "search_fields", None):
        known.add("search")
    extra: dict[str, set[str]] = getattr(view, "extra_query_params", {})
    known.update(extra.get(getattr(view, "action", None) or "", set()))
    return known


def refuse_unknown_params(request: Request, known: set[str]) -> None:
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        listed = ", ".join(sorted(known))
        raise ValidationError({name[:100]: [f"unknown query parameter; this one takes: {listed}"]
                               for name in unknown[:20]})


class FilterBackend(DjangoFilterBackend):
    """Filters generated from a view's ``filterset_fields`` use the bounded FilterSet too, and a
    query parameter the view does not know is refused (400) before any filtering."""

    filterset_base = FilterSet

    def filter_queryset(self, request: Request, queryset: Any, view: Any) -> Any:
        refuse_unknown_params(request, known_params(view, self.get_filterset_class(view, queryset)))
        return super().filter_queryset(request, queryset, view)


class OrderingFilter(drf_filters.OrderingFilter):
    """DRF's ordering, refusing a term that is not one of the view's ordering fields (DRF drops it)."""

    def get_ordering(self, request: Request, queryset: Any, view: Any) -> Any:
        params = request.query_params.get(self.ordering_param)
        if params:
            fields = [param.strip() for param in params.split(",") if param.strip()]
            valid = {name for name, _label in self.get_valid_fields(queryset, view, {"request": request})}
            wrong = [term for term in fields if term.lstrip("-") not in valid]
            if wrong:
                raise ValidationError({self.ordering_param: [
                    f"cannot order by {', '.join(w[:60] for w in wrong[:5])}; choose from {', '.join(sorted(valid))} "
                    "(a leading - for descending)"]})
        return super().get_ordering(request, queryset, view)


class SearchFilter(drf_filters.SearchFilter):
    """DRF's search (each word must match one of the view's ``search_fields``), bounded in length."""

    def get_search_terms(self, request: Request) -> list[str]:
        raw = request.query_params.get(self.search_param, "")
        if len(raw) > 200:
            raise ValidationError({self.search_param: ["at most 200 characters"]})
        return list(super().get_search_terms(request))[:10]
