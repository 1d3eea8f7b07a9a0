"""Settings page for your own API tokens: make one (the key is shown once), see when each was last
used, revoke. Anyone logged in manages their own tokens and sees nobody else's."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from django import forms
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts import services
from accounts.models import ApiToken


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="what it is for, e.g. 'jira integration'")
    expires_in_days = forms.IntegerField(required=False, min_value=1, max_value=3650,
                                         help_text="empty: never expires")


def token_settings(request: HttpRequest) -> HttpResponse:
    user = cast(User, request.user)
    form = TokenForm(request.POST or None)
    new_key = None
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data.get("expires_in_days")
        try:
            _token, new_key = services.issue(user, form.cleaned_data["name"],
                                             timezone.now() + timedelta(days=days) if days else None)
        except services.TokenError as exc:
            form.add_error(None, str(exc))
        else:
            form = TokenForm()
    return render(request, "accounts/tokens.html", {
        "tokens": ApiToken.objects.filter(user=user), "form": form, "new_key": new_key, "now": timezone.now()})


@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        token = services.revoke(cast(User, request.user), pk)
    except services.TokenError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Token {token.name} revoked.")
    return redirect("accounts-ui:tokens")
