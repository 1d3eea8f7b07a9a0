from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from console import views

urlpatterns = [
    path("", views.home, name="home"),
    path("settings/", views.settings_page, name="settings"),
    # Browsers ask for /favicon.ico whatever the page says: the console's icon (open, no login).
    path("favicon.ico", RedirectView.as_view(url=static("console/favicon.svg"), permanent=True), name="favicon"),
]
