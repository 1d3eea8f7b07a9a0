"""The metric families `/metrics` exposes, read from the database (and the broker) at scrape time.

State gauges come straight from the tables, so every web process answers the same and nothing
lives in process memory; counters and histograms come from the evidence totals (metrics.rollup).
Each family is one function; `collect()` runs them in order. What keeps a scrape cheap on a big
database: exposures and sweeps are counted with one GROUP BY each, campaigns are only the active
ones and those finished within GPUSWEEP_METRICS_FINISHED_CAMPAIGNS_S, and the evidence is read by
primary key from where the last fold stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db.models import Count, Max, Model, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from advisories.choices import ExposureState, Severity
from advisories.models import Exposure
from campaigns.choices import CampaignStatus, MoveState, SweepState
from campaigns.models import Campaign, NodeSweep, WorkloadMove
from gpusweep.celery import app as celery_app
from inventory.choices import ServiceState
from inventory.models import Node
from metrics import rollup

DUE_SOON = timedelta(days=7)
# Where the webhooks app keeps its delivery log, tried in order unless the setting names one.
WEBHOOK_MODELS = ("webhooks.Delivery", "webhooks.WebhookDelivery")
WEBHOOK_RESULT_FIELDS = ("result", "outcome", "status", "state")


def exposures() -> Iterator[Metric]:
    now = timezone.now()
    open_ = GaugeMetricFamily("gpusweep_exposures_open", "Exposures not remediated, by severity and state "
                              "(open, or risk accepted)", labels=["severity", "state"])
    overdue = GaugeMetricFamily("gpusweep_exposures_overdue", "Open exposures past their deadline",
                                labels=["severity"])
    due = GaugeMetricFamily("gpusweep_exposures_due_7d", "Open exposures whose deadline falls within 7 days",
                            labels=["severity"])
    rows = Exposure.objects.filter(state__in=ExposureState.ACTIVE).values("severity", "state").annotate(
        n=Count("id"), late=Count("id", filter=Q(deadline__lt=now)),
        soon=Count("id", filter=Q(deadline__gte=now, deadline__lt=now + DUE_SOON)))
    counts: dict[tuple[str, str], dict[str, Any]] = {(r["severity"], r["state"]): dict(r) for r in rows}
    severities = [*Severity.values(), *sorted({s for s, _ in counts} - set(Severity.values()))]
    for severity in severities:
        label = severity or "unknown"
        for state in sorted(ExposureState.ACTIVE):
            open_.add_metric([label, state], counts.get((severity, state), {}).get("n", 0))
        row: dict[str, Any] = counts.get((severity, ExposureState.OPEN), {})
        overdue.add_metric([label], row.get("late", 0))
        due.add_metric([label], row.get("soon", 0))
    yield from (open_, overdue, due)


def _campaigns() -> list[Campaign]:
    """Active campaigns, and those finished recently enough to still be on a dashboard."""
    since = timezone.now() - timedelta(seconds=settings.GPUSWEEP_METRICS_FINISHED_CAMPAIGNS_S)
    return list(Campaign.objects.filter(Q(status__in=CampaignStatus.ACTIVE)
                                        | Q(status__in=CampaignStatus.TERMINAL, finished_at__gte=since))
                .only("id", "name", "status", "started_at", "soak_started_at", "soak_s", "limits", "step_timeout_s"))


def campaigns() -> Iterator[Metric]:
    chosen = _campaigns()
    labels = ["campaign", "name"]
    sweeps = GaugeMetricFamily("gpusweep_node_sweeps", "Node sweeps by state, per campaign", labels=[*labels, "state"])
    status = GaugeMetricFamily("gpusweep_campaign_status", "1 for the campaign's current status",
                               labels=[*labels, "status"])
    quiet = GaugeMetricFamily("gpusweep_campaign_seconds_since_progress",
                              "Seconds since a running campaign last started or finished a step (a soak counts "
                              "as progress until it ends)", labels=labels)
    timeout = GaugeMetricFamily("gpusweep_campaign_step_timeout_seconds",
                                "The campaign's step deadline: a step older than this is re-driven", labels=labels)
    ids = [c.pk for c in chosen]
    counts = {(r["campaign_id"], r["state"]): r["n"] for r in NodeSweep.objects.filter(campaign_id__in=ids).values(
        "campaign_id", "state").annotate(n=Count("id"))}
    now = timezone.now()
    running = [c.pk for c in chosen if c.status == CampaignStatus.RUNNING]
    last_step = dict(NodeSweep.objects.filter(campaign_id__in=running).values("campaign_id").annotate(
        last=Max("step_started_at")).values_list("campaign_id", "last"))
    for campaign in chosen:
        names = [str(campaign.pk), campaign.name]
        for state in SweepState.values():
            sweeps.add_metric([*names, state], counts.get((campaign.pk, state), 0))
        status.add_metric([*names, campaign.status], 1)
        timeout.add_metric(names, campaign.step_timeout_s)
        if campaign.status != CampaignStatus.RUNNING:
            continue
        moments = [m for m in (campaign.started_at, last_step.get(campaign.pk)) if m is not None]
        if campaign.soak_started_at is not None:
            soak = int((campaign.limits or {}).get("soak_s", campaign.soak_s) or 0)
            moments.append(campaign.soak_started_at + timedelta(seconds=soak))
        if moments:
            quiet.add_metric(names, max(0.0, (now - max(moments)).total_seconds()))
    yield from (sweeps, status, quiet, timeout)
    stranded = GaugeMetricFamily("gpusweep_workloads_stranded",
                                 "Workloads a failed sweep could restore nowhere (checkpoint kept): "
                                 "manage.py recover_stranded CAMPAIGN restores them", labels=labels)
    for row in (WorkloadMove.objects.filter(state=MoveState.STRANDED).values("sweep__campaign_id",
                                                                              "sweep__campaign__name")
                .annotate(n=Count("id")).order_by()):
        stranded.add_metric([str(row["sweep__campaign_id"]), row["sweep__campaign__name"]], row["n"])
    yield stranded


def _histogram(family: rollup.Family, rows: list[Any]) -> HistogramMetricFamily:
    metric = HistogramMetricFamily(family.name, family.help, labels=list(family.label_names))
    bounds = family.bounds or ()
    for row in rows:
        labels = json.loads(row.labels)
        # Each observation is stored under the lowest bound it fits: a bucket counts every key at or below it.
        stored = [(float(key), int(n)) for key, n in row.buckets.items() if key != "+Inf"]
        buckets = [(_le(bound), float(sum(n for key, n in stored if key <= bound))) for bound in bounds]
        buckets.append(("+Inf", float(row.count)))
        metric.add_metric([labels[name] for name in family.label_names], buckets, row.sum)
    return metric


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def evidence() -> Iterator[Metric]:
    rollup.fold()
    found = rollup.totals()
    for family in rollup.FAMILIES:
        if family.bounds is not None:
            yield _histogram(family, found[family.name])
            continue
        counter = CounterMetricFamily(family.name, family.help, labels=list(family.label_names))
        for row in found[family.name]:
            labels = json.loads(row.labels)
            counter.add_metric([labels[name] for name in family.label_names], row.count)
        yield counter


def agents() -> Iterator[Metric]:
    age = GaugeMetricFamily("gpusweep_agent_heartbeat_age_seconds", "Seconds since the node's agent last sent a "
                            "heartbeat", labels=["cluster", "node"])
    interval = GaugeMetricFamily("gpusweep_agent_heartbeat_interval_seconds",
                                 "The heartbeat interval the service asks agents for")
    interval.add_metric([], settings.GPUSWEEP_AGENT_HEARTBEAT_S)
    now = timezone.now()
    for cluster, node, heard in Node.objects.filter(heartbeat_at__isnull=False).exclude(
            service_state=ServiceState.GONE).values_list("cluster__name", "name", "heartbeat_at").order_by():
        if heard is not None:
            age.add_metric([cluster, node], max(0.0, (now - heard).total_seconds()))
    yield from (age, interval)


def webhook_log() -> tuple[type[Model], str] | None:
    """The webhooks app's delivery model and its result field, if that app is installed.

    GPUSWEEP_METRICS_WEBHOOK_DELIVERIES names it ("app_label.Model:field"); empty, the usual
    names are tried. Absent (the app is not merged or not installed), the family is exposed
    with no samples, so a dashboard and alert can be written before it exists.
    """
    configured = settings.GPUSWEEP_METRICS_WEBHOOK_DELIVERIES
    if configured:
        model_name, _, field = configured.partition(":")
        try:
            model = apps.get_model(model_name)
            model._meta.get_field(field)
        except (LookupError, ValueError, FieldDoesNotExist) as exc:
            raise ImproperlyConfigured(f"GPUSWEEP_METRICS_WEBHOOK_DELIVERIES={configured!r}: {exc}") from exc
        return model, field
    for model_name in WEBHOOK_MODELS:
        try:
            model = apps.get_model(model_name)
        except LookupError:
            continue
        for field in WEBHOOK_RESULT_FIELDS:
            try:
                model._meta.get_field(field)
            except FieldDoesNotExist:
                continue
            return model, field
    return None


def webhooks() -> Iterator[Metric]:
    deliveries = GaugeMetricFamily("gpusweep_webhook_deliveries", "Webhook deliveries in the delivery log, by result",
                                   labels=["result"])
    source = webhook_log()
    if source is not None:
        model, field = source
        for row in model._default_manager.values(field).annotate(n=Count("pk")).order_by():
            deliveries.add_metric([str(row[field])], row["n"])
    yield deliveries


def queue_depth() -> Iterator[Metric]:
    """Messages waiting in the task queue (not those a worker holds), and whether the broker answered."""
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    depth = GaugeMetricFamily("gpusweep_celery_queue_depth", "Messages waiting in the Celery queue", labels=["queue"])
    up = GaugeMetricFamily("gpusweep_celery_broker_up", "1 when the broker answered this scrape")
    with celery_app.connection_for_read() as conn:
        errors: tuple[type[BaseException], ...] = (KombuOperationalError, OSError, *conn.connection_errors)
        try:
            conn.ensure_connection(max_retries=1, timeout=2)
            channel: Any = conn.default_channel
            try:
                waiting = channel.queue_declare(queue=queue, passive=True).message_count
            except conn.channel_errors:
                waiting = 0  # Redis drops an empty queue's key; on AMQP nobody declared it yet
            depth.add_metric([queue], waiting)
            up.add_metric([], 1)
        except errors:
            up.add_metric([], 0)
    yield from (depth, up)


SOURCES: tuple[Callable[[], Iterator[Metric]], ...] = (exposures, campaigns, evidence, agents, webhooks, queue_depth)


class DatabaseCollector(Collector):
    """Everything gpusweep exports, read afresh on every scrape."""

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        for source in SOURCES:
            yield from source()
        took = GaugeMetricFamily("gpusweep_metrics_scrape_seconds", "How long this scrape took to read the metrics")
        took.add_metric([], time.monotonic() - started)
        yield took
