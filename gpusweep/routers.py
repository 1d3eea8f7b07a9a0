"""The DRF router of every app's api.py, kept apart from gpusweep.api, which imports those modules."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter


class ApiRouter(DefaultRouter):
    """No format-suffix routes (``evidence.json``): DRF would pass a ``format`` argument that custom
    actions do not take (a 500). The API answers JSON; ``?format=`` still picks a renderer.
    """

    include_format_suffixes = False
