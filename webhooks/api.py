"""REST API under /api/v1/webhooks/: subscriptions (admins), the events sent and the delivery log.

Every role reads the log; operators replay a delivery; admins manage subscriptions (the secret
is write-only: it never comes back).
"""

from __future__ import annotations

from typing import Any, cast

import django_filters
from django.contrib.auth.models import User
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gpusweep.filters import FilterSet, MultipleChoiceFilter
from gpusweep.roles import Role
from gpusweep.routers import ApiRouter
from webhooks import services
from webhooks.choices import DeliveryState, EventType
from webhooks.models import Delivery, Event, Subscription


class WebhookSubscriptionSerializer(serializers.ModelSerializer):
    events = serializers.ListField(child=serializers.ChoiceField(choices=EventType.choices()), required=False,
                                   help_text="event types; empty for all")
    secret = serializers.CharField(write_only=True, min_length=16, max_length=200,
                                   help_text="the HMAC-SHA256 key (at least 16 characters); never shown again")
    url = serializers.URLField(max_length=1000)

    class Meta:
        model = Subscription
        fields = ["id", "name", "url", "events", "template", "options", "secret", "authorization_env", "active",
                  "created_at"]
        read_only_fields = ["created_at"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The same checks as the settings page's form (webhooks.services.subscription_errors).
        errors = services.subscription_errors(attrs)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class WebhookEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = ["id", "kind", "key", "subject", "summary", "data", "at"]


class WebhookDeliverySerializer(serializers.ModelSerializer):
    subscription_name = serializers.CharField(source="subscription.name", read_only=True)
    event_kind = serializers.CharField(source="event.kind", read_only=True)
    event_summary = serializers.CharField(source="event.summary", read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "subscription", "subscription_name", "event", "event_kind", "event_summary", "state",
                  "attempts", "next_attempt_at", "last_attempt_at", "delivered_at", "response_status",
                  "response_excerpt", "error", "replay_of", "created_at"]
        read_only_fields = fields


class WebhookDeliveryFilter(FilterSet):
    state = MultipleChoiceFilter(choices=DeliveryState.choices())
    kind = django_filters.ChoiceFilter(field_name="event__kind", choices=EventType.choices())

    class Meta:
        model = Delivery
        fields = ["subscription", "event", "state", "kind"]


class WebhookEventFilter(FilterSet):
    kind = MultipleChoiceFilter(choices=EventType.choices())

    class Meta:
        model = Event
        fields = ["kind", "subject"]


class SubscriptionViewSet(viewsets.ModelViewSet):
    queryset = Subscription.objects.all()
    serializer_class = WebhookSubscriptionSerializer
    write_roles = {Role.ADMIN}
    action_roles = {"test": {Role.OPERATOR}}
    search_fields = ["name", "url"]
    ordering_fields = ["name", "created_at"]

    def perform_create(self, serializer: serializers.BaseSerializer[Subscription]) -> None:
        serializer.save(created_by=cast(User, self.request.user))

    @extend_schema(request=None, responses={202: WebhookEventSerializer})
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        """Send a test event to this subscription only (it shows in the delivery log)."""
        subscription = self.get_object()
        if not subscription.active:
            return Response({"detail": "the subscription is inactive"}, status=status.HTTP_409_CONFLICT)
        event = services.send_test(subscription, cast(User, request.user))
        return Response(WebhookEventSerializer(event).data, status=status.HTTP_202_ACCEPTED)


class EventViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Event.objects.all()
    serializer_class = WebhookEventSerializer
    filterset_class = WebhookEventFilter
    ordering_fields = ["id", "at"]


class DeliveryViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Delivery.objects.select_related("subscription", "event")
    serializer_class = WebhookDeliverySerializer
    filterset_class = WebhookDeliveryFilter
    ordering_fields = ["id", "created_at", "last_attempt_at"]
    action_roles = {"replay": {Role.OPERATOR}}

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def replay(self, request: Request, pk: str | None = None) -> Response:
        """Send this delivery's event again (a new delivery at the end of the subscription's line)."""
        delivery = self.get_object()
        try:
            again = services.replay(delivery.pk, cast(User, request.user))
        except services.WebhookError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        again = Delivery.objects.select_related("subscription", "event").get(pk=again.pk)
        return Response(WebhookDeliverySerializer(again).data, status=status.HTTP_202_ACCEPTED)


router = ApiRouter()
router.register("subscriptions", SubscriptionViewSet)
router.register("events", EventViewSet)
router.register("deliveries", DeliveryViewSet)
