from __future__ import annotations

from django.apps import apps
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from gpusweep.roles import user_roles


def home(request: HttpRequest) -> HttpResponse:
    """The landing page: what the fleet and the advisories look like right now."""
    counts = {}
    for label in ("inventory.Node", "advisories.Advisory", "advisories.Exposure", "campaigns.Campaign"):
        try:
            model = apps.get_model(label)
        except LookupError:
            continue
        counts[model._meta.verbose_name_plural] = model._default_manager.count()
    return render(
        request,
        "home.html",
        {"counts": counts, "roles": sorted(user_roles(request.user))},
    )
