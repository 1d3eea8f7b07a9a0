from __future__ import annotations

from django.apps import apps
from django.contrib import admin

OUR_APPS = ("inventory", "advisories", "campaigns", "executors")


def test_every_model_of_ours_is_in_the_admin():
    missing = [
        model._meta.label
        for app in OUR_APPS
        for model in apps.get_app_config(app).get_models()
        if not admin.site.is_registered(model)
    ]
    assert missing == []
