from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"

    def ready(self) -> None:
        from gpusweep import registry
        from webhooks import receivers  # noqa: F401  (listens to campaigns' and advisories' signals)

        registry.settings_links.add(registry.Link("Webhooks", order=10, path="/settings/webhooks/"))
