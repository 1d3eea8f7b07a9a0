"""The auditors' reports, beside the pages they are about (included at the root by gpusweep.urls)."""

from django.urls import path

from reports import views

urlpatterns = [
    path("reports/", views.report_list, name="report-list"),
    path("campaigns/<int:pk>/report.<str:fmt>", views.campaign_report, name="campaign-report"),
    path("advisories/<str:public_id>/report.<str:fmt>", views.advisory_report, name="advisory-report"),
    path("advisories/pending.<str:fmt>", views.pending_report, name="pending-report"),
]
