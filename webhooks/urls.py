from django.urls import path

from webhooks import views

app_name = "webhooks-ui"
urlpatterns = [
    path("", views.webhook_settings, name="settings"),
    path("<int:pk>/", views.subscription_edit, name="subscription-edit"),
    path("<int:pk>/delete/", views.subscription_delete, name="subscription-delete"),
    path("<int:pk>/test/", views.subscription_test, name="subscription-test"),
    path("deliveries/<int:pk>/replay/", views.delivery_replay, name="delivery-replay"),
]
