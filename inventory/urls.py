from django.urls import path

from inventory import views

app_name = "inventory-ui"
urlpatterns = [
    path("", views.node_list, name="node-list"),
    path("<int:pk>/", views.node_detail, name="node-detail"),
]
