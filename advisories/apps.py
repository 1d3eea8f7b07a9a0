from django.apps import AppConfig


class AdvisoriesConfig(AppConfig):
    name = "advisories"

    def ready(self) -> None:
        from advisories import signals  # noqa: F401  (connects the inventory hook)
