from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from gpusweep import health, views
from gpusweep.api import api_urlpatterns
from metrics.views import metrics
from reports import views as reports

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("", views.home, name="home"),
    path("settings/", views.settings_page, name="settings"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("nodes/", include("inventory.urls")),
    # The auditors' reports, beside the pages they are about (reports/views.py).
    path("campaigns/<int:pk>/report.<str:fmt>", reports.campaign_report, name="campaign-report"),
    path("advisories/<int:pk>/report.<str:fmt>", reports.advisory_report, name="advisory-report"),
    path("advisories/pending.<str:fmt>", reports.pending_report, name="pending-report"),
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
