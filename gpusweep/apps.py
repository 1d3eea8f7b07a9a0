from django.apps import AppConfig


class GpusweepConfig(AppConfig):
    name = "gpusweep"
    verbose_name = "gpusweep core"
