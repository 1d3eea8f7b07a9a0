"""gpusweep.narrow's readers against what DRF and Django give for the same values, on the database
the suite runs on (PostgreSQL writes the times itself, other databases go through Python)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework import serializers

from gpusweep.narrow import Times, json_column, json_value
from inventory.models import Cluster, Node

TIMES = [
    dt.datetime(2026, 12, 7, 6, 37, 40, tzinfo=dt.UTC),  # no fraction: DRF writes none
    dt.datetime(2026, 12, 7, 6, 37, 40, 123400, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 7, 6, 37, 40, 1, tzinfo=dt.UTC),
    dt.datetime(999, 1, 2, 3, 4, 5, 600000, tzinfo=dt.UTC),  # a year before 1000
    dt.datetime(2026, 3, 29, 23, 59, 59, 999999, tzinfo=dt.timezone(dt.timedelta(hours=5))),  # another offset
]


@pytest.mark.django_db
@pytest.mark.parametrize("moment", TIMES, ids=str)
def test_a_time_reads_as_drf_writes_it(moment):
    node = Node.objects.create(cluster=Cluster.objects.create(name="c", kind="static"), name="n", last_seen=moment)
    times = Times()
    read = Node.objects.filter(pk=node.pk).annotate(seen=times.column("last_seen")).values_list("seen", flat=True)
    assert times.write(read.get()) == serializers.DateTimeField().to_representation(node.last_seen)
    assert times.write(None) is None
    assert timezone.get_current_timezone_name() == "UTC"  # the zone these cases are written for


@pytest.mark.django_db
def test_a_json_column_reads_as_django_reads_it():
    labels = {"zone": "b", "z": [1, 2.5, None, True], "big": 2**70 + 1, "nested": {"é": "ü"}, "": ""}
    node = Node.objects.create(
        cluster=Cluster.objects.create(name="c", kind="static"), name="n", labels=labels, fact_conflicts={}
    )
    text, empty = (
        Node.objects.filter(pk=node.pk)
        .annotate(a=json_column("labels"), b=json_column("fact_conflicts"))
        .values_list("a", "b")
        .get()
    )
    assert json_value(text) == Node.objects.get(pk=node.pk).labels == labels
    assert list(json_value(text)) == list(Node.objects.values_list("labels", flat=True).get())  # the same key order
    assert json_value(empty) == {} and json_value(None) is None


@pytest.mark.postgres  # elsewhere the times are parsed and written in Python
@pytest.mark.django_db
def test_postgresql_writes_the_times_itself():
    from django.db import connection

    from conftest import need

    need(connection.vendor == "postgresql", "set DATABASE_URL=postgres://... (PostgreSQL writes the times itself)")
    assert Times().as_text
