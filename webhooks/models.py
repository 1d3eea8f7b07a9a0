"""Webhook subscriptions, the events sent to them and the delivery log.

An ``Event`` is written once per occurrence (``key`` makes emitting it twice a no-op); a
``Delivery`` per subscription that wants it. Deliveries of one subscription are sent one at a
time in event order (``Subscription.lease_until`` is the claim), so a receiver sees events in
the order they happened even across retries.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from webhooks.choices import DeliveryState, EventType, Template


class Subscription(models.Model):
    name = models.CharField(max_length=100, unique=True)
    url = models.URLField(max_length=1000)
    events = models.JSONField(default=list, help_text="event types; empty for all")
    template = models.CharField(max_length=30, choices=Template.choices(), default=Template.GENERIC)
    options = models.JSONField(default=dict, blank=True,
                               help_text='template options, e.g. {"project": "SEC", "issue_type": "Task"}')
    secret = models.CharField(max_length=200, help_text="HMAC-SHA256 key the receiver checks signatures with")
    authorization_env = models.CharField(
        max_length=100, blank=True,
        help_text="name of an environment variable whose value is sent as the Authorization header "
                  "(Jira/ServiceNow credentials stay out of the database)")
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    lease_until = models.DateTimeField(null=True, blank=True, help_text="a worker is sending until then")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def wants(self, kind: str) -> bool:
        return self.active and (not self.events or kind in self.events)


class Event(models.Model):
    kind = models.CharField(max_length=40, choices=EventType.choices())
    key = models.CharField(max_length=200, unique=True, help_text="one event per occurrence")
    subject = models.CharField(max_length=200, help_text='what it is about, e.g. "campaign:7"')
    summary = models.CharField(max_length=300)
    data = models.JSONField(default=dict)
    at = models.DateTimeField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject}"


class Delivery(models.Model):
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=20, choices=DeliveryState.choices(), default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_excerpt = models.CharField(max_length=500, blank=True)
    error = models.CharField(max_length=500, blank=True)
    replay_of = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["subscription", "state", "id"], name="webhooks_delivery_queue")]

    def __str__(self) -> str:
        return f"{self.event} -> {self.subscription} ({self.state})"
