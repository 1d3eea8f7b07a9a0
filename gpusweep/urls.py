"""The root URLconf. Apps are included by name, never imported: gpusweep is the bottom layer
(docs/architecture.md, Layers)."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from gpusweep import health
from gpusweep.api import api_urlpatterns

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("metrics.urls")),
    path("", include("console.urls")),  # the overview and /settings/
    path("accounts/", include("accounts.auth_urls")),  # login, logout, single sign-on
    path("accounts/", include("django.contrib.auth.urls")),
    path("nodes/", include("inventory.urls")),
    path("", include("reports.urls")),  # beside the pages they are about, before advisories' own
    path("advisories/", include("advisories.urls")),
    path("campaigns/", include("campaigns.urls")),
    path("costs/", include("costs.urls")),
    path("settings/tokens/", include("accounts.urls")),
    path("settings/webhooks/", include("webhooks.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_urlpatterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]
