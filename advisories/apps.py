from django.apps import AppConfig


class AdvisoriesConfig(AppConfig):
    name = "advisories"
