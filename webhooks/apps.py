from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"

    def ready(self) -> None:
        from webhooks import receivers  # noqa: F401  (listens to campaigns' and advisories' signals)
