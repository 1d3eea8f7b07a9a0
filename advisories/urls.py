from django.urls import path

from advisories import views

app_name = "advisories-ui"
urlpatterns = [
    path("", views.advisory_list, name="advisory-list"),
    path("exposures/", views.exposure_list, name="exposure-list"),
    path("exposures/bulk/", views.exposure_bulk, name="exposure-bulk"),
    path("exposures/<int:pk>/decide/", views.exposure_decide, name="exposure-decide"),
    path("review-items/<int:pk>/resolve/", views.review_resolve, name="review-resolve"),
    # By public id (nvidia-5703), after the fixed paths above so "exposures" is never taken for one.
    path("<str:public_id>/", views.advisory_detail, name="advisory-detail"),
]
