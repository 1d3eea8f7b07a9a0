"""Settings page for webhooks: subscriptions (admins edit), the delivery log (everyone with a role
reads; operators replay and send test events). The same services as the API."""

from __future__ import annotations

import json
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from gpusweep.pages import paginate
from gpusweep.roles import Role, has_role, user_roles
from webhooks import services
from webhooks.choices import DeliveryState, EventType
from webhooks.models import Delivery, Subscription


class SubscriptionForm(forms.ModelForm):
    events = forms.MultipleChoiceField(choices=EventType.choices(), required=False,
                                       widget=forms.CheckboxSelectMultiple, help_text="none ticked: every event")
    options = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                              help_text='JSON, e.g. {"project": "SEC", "issue_type": "Task"} for Jira')
    url = forms.URLField(max_length=1000, assume_scheme="https")
    secret = forms.CharField(required=False, widget=forms.PasswordInput(render_value=False),
                             help_text="HMAC-SHA256 key, at least 16 characters (left empty when editing: unchanged)")

    class Meta:
        model = Subscription
        fields = ["name", "url", "events", "template", "options", "secret", "authorization_env", "active"]
        # Labels written for people, as the console's other forms have them (no colon after them).
        labels = {"name": "Name", "url": "Receiver URL", "events": "Events", "template": "Payload format",
                  "options": "Format options", "secret": "Signing secret",
                  "authorization_env": "Authorization header from the environment variable",
                  "active": "Active: send events to it"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        for name, label in self.Meta.labels.items():  # the fields declared above too
            self.fields[name].label = label
        if self.instance.pk:
            self.initial["options"] = json.dumps(self.instance.options)

    def clean_options(self) -> dict[str, Any]:
        raw = self.cleaned_data.get("options") or "{}"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
        return value if isinstance(value, dict) else {"": value}

    def clean_secret(self) -> str:
        secret = self.cleaned_data.get("secret") or ""
        if not secret and self.instance.pk:
            return self.instance.secret
        return secret

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name, message in services.subscription_errors(
                {k: cleaned.get(k) for k in ("events", "options", "url", "authorization_env", "secret")
                 if k in cleaned}).items():
            self.add_error(name if name in self.fields else None, message)
        return cleaned


def _reader(request: HttpRequest) -> None:
    if not user_roles(request.user):
        raise PermissionDenied("the webhook settings need a role")


def _require(request: HttpRequest, role: Role, what: str) -> None:
    if not has_role(request.user, role):
        raise PermissionDenied(f"{role.value}s {what}")


def webhook_settings(request: HttpRequest) -> HttpResponse:
    _reader(request)
    is_admin = has_role(request.user, Role.ADMIN)
    form = SubscriptionForm(request.POST or None) if is_admin else None
    if request.method == "POST":
        if form is None:
            raise PermissionDenied("admins manage webhook subscriptions")
        if form.is_valid():
            subscription = form.save(commit=False)
            subscription.created_by = cast(User, request.user)
            subscription.save()
            messages.success(request, f"Subscription {subscription.name} created.")
            return redirect("webhooks-ui:settings")
    deliveries = Delivery.objects.select_related("subscription", "event").order_by("-id")
    chosen = request.GET.get("subscription")
    if chosen and chosen.isdigit():
        deliveries = deliveries.filter(subscription_id=int(chosen))
    state = request.GET.get("state")
    if state in DeliveryState.values():
        deliveries = deliveries.filter(state=state)
    return render(request, "webhooks/settings.html", {
        "subscriptions": Subscription.objects.all(), "form": form, "is_admin": is_admin,
        "can_act": has_role(request.user, Role.OPERATOR), "page": paginate(request, deliveries, per_page=50),
        "states": DeliveryState.choices(), "chosen": chosen, "state": state,
    })


def subscription_edit(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Role.ADMIN, "manage webhook subscriptions")
    subscription = get_object_or_404(Subscription, pk=pk)
    form = SubscriptionForm(request.POST or None, instance=subscription)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, f"Subscription {subscription.name} saved.")
        return redirect("webhooks-ui:settings")
    return render(request, "webhooks/subscription_form.html", {"form": form, "subscription": subscription})


@require_POST
def subscription_delete(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Role.ADMIN, "manage webhook subscriptions")
    subscription = get_object_or_404(Subscription, pk=pk)
    subscription.delete()
    messages.success(request, f"Subscription {subscription.name} deleted with its delivery log.")
    return redirect("webhooks-ui:settings")


@require_POST
def subscription_test(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Role.OPERATOR, "send test events")
    subscription = get_object_or_404(Subscription, pk=pk, active=True)
    services.send_test(subscription, cast(User, request.user))
    messages.success(request, f"Test event queued for {subscription.name}.")
    return redirect("webhooks-ui:settings")


@require_POST
def delivery_replay(request: HttpRequest, pk: int) -> HttpResponse:
    _require(request, Role.OPERATOR, "replay deliveries")
    try:
        again = services.replay(pk, cast(User, request.user))
    except services.WebhookError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Delivery {pk} replayed as {again.pk}.")
    return redirect("webhooks-ui:settings")
