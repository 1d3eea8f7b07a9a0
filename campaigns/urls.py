from django.urls import path

from campaigns import views

app_name = "campaigns-ui"
urlpatterns = [
    path("", views.campaign_list, name="campaign-list"),
    path("new/", views.campaign_create, name="campaign-create"),
    path("new/match/", views.campaign_match, name="campaign-match"),
    path("new/preview/", views.campaign_preview, name="campaign-preview"),
    path("<int:pk>/", views.campaign_detail, name="campaign-detail"),
    path("<int:pk>/board/", views.campaign_board, name="campaign-board"),
    path("<int:pk>/evidence.<str:fmt>", views.campaign_evidence, name="campaign-evidence"),
    path("<int:pk>/<str:action>/", views.campaign_action, name="campaign-action"),
]
