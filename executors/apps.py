from django.apps import AppConfig


class ExecutorsConfig(AppConfig):
    name = "executors"

    def ready(self) -> None:
        from executors import portability  # noqa: F401  (registers the checkpoint engines: inventory.choices)
