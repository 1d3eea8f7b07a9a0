from django.urls import path

from costs import views

app_name = "costs-ui"
urlpatterns = [
    path("", views.tools_page, name="tools"),
    path("drain/", views.drain_cost_page, name="drain-cost"),
    path("simulate/", views.simulate_page, name="simulate"),
]
