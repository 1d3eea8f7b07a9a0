from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "API tokens"

    def ready(self) -> None:
        from accounts import schema  # noqa: F401  (registers the OpenAPI security scheme)
        from gpusweep import registry

        registry.settings_links.add(registry.Link("API tokens", order=20, path="/settings/tokens/"))
