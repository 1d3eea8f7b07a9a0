from django.apps import AppConfig


class ExecutorsConfig(AppConfig):
    name = "executors"
