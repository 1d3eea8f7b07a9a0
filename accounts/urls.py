from django.urls import path

from accounts import views

app_name = "accounts-ui"
urlpatterns = [
    path("", views.token_settings, name="tokens"),
    path("<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
]
