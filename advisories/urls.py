from django.urls import path

from advisories import views

app_name = "advisories-ui"
urlpatterns = [
    path("", views.advisory_list, name="advisory-list"),
    path("<int:pk>/", views.advisory_detail, name="advisory-detail"),
    path("exposures/", views.exposure_list, name="exposure-list"),
    path("exposures/bulk/", views.exposure_bulk, name="exposure-bulk"),
    path("exposures/<int:pk>/decide/", views.exposure_decide, name="exposure-decide"),
    path("review-items/<int:pk>/resolve/", views.review_resolve, name="review-resolve"),
]
