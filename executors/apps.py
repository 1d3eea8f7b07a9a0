from django.apps import AppConfig


class ExecutorsConfig(AppConfig):
    name = "executors"

    def ready(self) -> None:
        from executors.base import ALIASES
        from gpusweep import registry

        registry.executor_names.update(ALIASES)
        from executors import portability  # noqa: F401  (registers the checkpoint engines: inventory.choices)
