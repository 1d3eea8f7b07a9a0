"""Emitting events, delivering them (signed, in order, with retries and backoff) and replaying them.

- ``emit`` writes the Event (once per ``key``) and one Delivery per subscription that wants it, in
  one transaction, then enqueues each subscription's delivery task on commit.
- ``deliver`` sends one subscription's waiting deliveries oldest first, one at a time: it claims the
  subscription with a conditional UPDATE of ``lease_until`` (two workers never send for one
  subscription at once), and stops at the first failure, which is retried after
  ``GPUSWEEP_WEBHOOK_BACKOFF_MS * 2**(attempts-1)`` (capped at an hour) until
  ``GPUSWEEP_WEBHOOK_MAX_ATTEMPTS``; then that delivery is marked failed and the next goes. So a
  receiver that fails twice gets the event on the third try, and nothing after it overtakes it.
- The signature: ``X-Gpusweep-Signature: t=<unix time>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``;
  a receiver recomputes it over the raw body and refuses an old ``t`` (replayed requests).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from gpusweep import secret_env
from webhooks import payloads, queue, wire
from webhooks.choices import DeliveryState, EventType
from webhooks.models import Delivery, Event, Subscription

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=120)
MAX_BACKOFF_S = 3600.0
BATCH = 200  # deliveries one task sends before it hands over to a fresh task
USER_AGENT = "gpusweep-webhooks/1"


class WebhookError(Exception):
    """A refused webhook request; the message says why."""


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify_signature(secret: str, header: str, body: bytes, tolerance_s: int = 300, now: float | None = None) -> bool:
    """What a receiver does (the tests' receiver uses it; the README shows it): True when it checks."""
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts.get("t", ""))
    except ValueError:
        return False
    if abs((now if now is not None else time.time()) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def subscription_errors(fields: dict[str, Any]) -> dict[str, str]:
    """What is wrong with a subscription's fields (those given), by field; the API and the page share it."""
    errors: dict[str, str] = {}
    events = fields.get("events")
    if events is not None:
        if not isinstance(events, list) or not all(isinstance(v, str) for v in events):
            errors["events"] = "a list of event types (empty for all)"
        elif unknown := sorted(set(events) - set(EventType.values())):
            errors["events"] = f"unknown event types {', '.join(unknown)}; known: {', '.join(EventType.values())}"
    options = fields.get("options")
    if options is not None and (not isinstance(options, dict)
                                or not all(isinstance(v, str | bool | int) for v in options.values())):
        errors["options"] = "an object of template options with plain values"
    url = fields.get("url")
    if url is not None and not str(url).lower().startswith(("http://", "https://")):
        errors["url"] = "an http(s) URL"
    env = fields.get("authorization_env") or ""
    if env and (problem := secret_env.problem(str(env))):
        errors["authorization_env"] = problem
    secret = fields.get("secret")
    if secret is not None and len(str(secret)) < 16:
        errors["secret"] = "at least 16 characters"
    return errors


def emit(kind: str, key: str, subject: str, summary: str, data: dict[str, Any]) -> Event | None:
    """Record an event and queue it for every subscription that wants it; None if `key` was emitted."""
    if kind not in EventType.values():
        raise ValueError(f"unknown webhook event type {kind!r}")
    subscriptions = [s for s in Subscription.objects.filter(active=True) if s.wants(kind)]
    if not subscriptions:
        return None  # nobody listens: keep no log of it
    try:
        with transaction.atomic():
            event = Event.objects.create(kind=kind, key=key[:200], subject=subject[:200], summary=summary[:300],
                                         data=wire.normalize(data), at=timezone.now())
            Delivery.objects.bulk_create([Delivery(subscription=s, event=event) for s in subscriptions])
            for subscription in subscriptions:
                queue.enqueue(subscription.pk)
    except IntegrityError:
        return None  # emitted before (the same key): once per occurrence
    return event


def event_body(event: Event) -> dict[str, Any]:
    return {"id": event.pk, "kind": event.kind, "at": wire.rfc3339(event.at), "subject": event.subject,
            "summary": event.summary, "data": event.data}


def backoff_s(attempts: int) -> float:
    base = settings.GPUSWEEP_WEBHOOK_BACKOFF_MS / 1000
    return float(min(MAX_BACKOFF_S, base * 2 ** max(0, attempts - 1)))


def _post(subscription: Subscription, delivery: Delivery) -> tuple[int | None, str, str]:
    """(HTTP status or None, response excerpt, error); a 2xx is success."""
    body = payloads.body_for(subscription.template, event_body(delivery.event), subscription.options)
    timestamp = int(time.time())
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
               "X-Gpusweep-Event": delivery.event.kind, "X-Gpusweep-Event-Id": str(delivery.event_id),
               "X-Gpusweep-Delivery": str(delivery.pk),
               "X-Gpusweep-Signature": sign(subscription.secret, timestamp, body)}
    if subscription.authorization_env:
        if secret_env.own(subscription.authorization_env):  # written before the allow-list, or by hand
            return None, "", f"{subscription.authorization_env} is one of the service's own settings: never sent"
        credential = os.environ.get(subscription.authorization_env, "")
        if not credential:
            return None, "", f"environment variable {subscription.authorization_env} is not set"
        headers["Authorization"] = credential
    request = urllib.request.Request(subscription.url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=settings.GPUSWEEP_WEBHOOK_TIMEOUT_S) as response:
            return int(response.status), response.read(500).decode(errors="replace"), ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(500).decode(errors="replace"), f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:  # refused, timed out, DNS, a bad URL
        return None, "", f"{type(exc).__name__}: {exc}"[:500]


def _claim(subscription_id: int) -> bool:
    now = timezone.now()
    return bool(Subscription.objects.filter(pk=subscription_id, active=True)
                .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now)).update(lease_until=now + LEASE))


def _release(subscription_id: int) -> None:
    Subscription.objects.filter(pk=subscription_id).update(lease_until=None)


def _next_waiting(subscription_id: int) -> Delivery | None:
    return (Delivery.objects.filter(subscription_id=subscription_id, state__in=DeliveryState.WAITING)
            .select_related("event").order_by("id").first())


def _send_some(subscription: Subscription) -> float | None:
    """Send waiting deliveries in order; the seconds until the head of the line is due, or None when idle."""
    for _ in range(BATCH):
        delivery = _next_waiting(subscription.pk)
        if delivery is None:
            return None
        now = timezone.now()
        if delivery.next_attempt_at and delivery.next_attempt_at > now:
            return (delivery.next_attempt_at - now).total_seconds()
        # Renew the claim before each send: a batch of slow receivers outlasts one lease.
        Subscription.objects.filter(pk=subscription.pk).update(lease_until=now + LEASE)
        status, excerpt, error = _post(subscription, delivery)
        attempts = delivery.attempts + 1
        done = status is not None and 200 <= status < 300
        fields: dict[str, Any] = {"attempts": attempts, "last_attempt_at": timezone.now(), "response_status": status,
                                  "response_excerpt": excerpt[:500], "error": error[:500]}
        if done:
            fields.update(state=DeliveryState.DELIVERED, delivered_at=timezone.now(), next_attempt_at=None)
        elif attempts >= settings.GPUSWEEP_WEBHOOK_MAX_ATTEMPTS:
            fields.update(state=DeliveryState.FAILED, next_attempt_at=None)
            log.warning("webhook %s: delivery %s failed after %s attempts: %s", subscription, delivery.pk, attempts,
                        error)
        else:
            wait = backoff_s(attempts)
            fields.update(state=DeliveryState.RETRYING, next_attempt_at=timezone.now() + timedelta(seconds=wait))
        # Conditional on the state it was sent in: a replay or an edit meanwhile is not overwritten.
        Delivery.objects.filter(pk=delivery.pk, state=delivery.state, attempts=delivery.attempts).update(**fields)
        if not done and fields["state"] == DeliveryState.RETRYING:
            return backoff_s(attempts)
    return 0.0  # more to send: a fresh task goes on


def deliver(subscription_id: int) -> str:
    """Send what is waiting for one subscription (the Celery task's body); says what it did."""
    subscription = Subscription.objects.filter(pk=subscription_id).first()
    if subscription is None or not subscription.active:
        return "inactive"
    if not _claim(subscription_id):
        queue.ENQUEUE[0](subscription_id, 2.0)  # someone is sending: look again shortly
        return "busy"
    try:
        wait = _send_some(subscription)
    finally:
        _release(subscription_id)
    if wait is None and _next_waiting(subscription_id) is not None:
        wait = 0.0  # emitted while we were finishing: its own task may have found us busy
    if wait is not None:
        queue.ENQUEUE[0](subscription_id, max(wait, 0.0))
        return "scheduled"
    return "idle"


def replay(delivery_id: int, user: User | None) -> Delivery:
    """Send a delivery's event again to its subscription (a new delivery, at the end of the line)."""
    original = Delivery.objects.select_related("subscription").filter(pk=delivery_id).first()
    if original is None:
        raise WebhookError("no such delivery")
    if not original.subscription.active:
        raise WebhookError(f"subscription {original.subscription} is inactive")
    with transaction.atomic():
        again = Delivery.objects.create(subscription=original.subscription, event_id=original.event_id,
                                        replay_of=original)
        queue.enqueue(original.subscription_id)
    log.info("webhook delivery %s replayed as %s by %s", original.pk, again.pk, user)
    return again


def redrive() -> int:
    """Enqueue every subscription with a delivery due (the beat's safety net for a lost message)."""
    now = timezone.now()
    due = (Delivery.objects.filter(state__in=DeliveryState.WAITING, subscription__active=True)
           .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
           .values_list("subscription_id", flat=True).distinct())
    ids = sorted(set(due))
    for subscription_id in ids:
        queue.ENQUEUE[0](subscription_id, 0.0)
    return len(ids)


def send_test(subscription: Subscription, user: User | None) -> Event | None:
    """A test event to one subscription only (from the settings page)."""
    with transaction.atomic():
        event = Event.objects.create(kind=EventType.TEST, key=f"test:{subscription.pk}:{time.time_ns()}",
                                     subject=f"subscription:{subscription.pk}",
                                     summary=f"gpusweep test event for {subscription.name}",
                                     data={"requested_by": str(user or "system")}, at=timezone.now())
        Delivery.objects.create(subscription=subscription, event=event)
        queue.enqueue(subscription.pk)
    return event
