from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts: API tokens and single sign-on"

    def ready(self) -> None:
        from accounts import schema  # noqa: F401  (registers the OpenAPI security scheme)
        from gpusweep import registry

        registry.settings_links.add(registry.Link("API tokens", order=20, path="/settings/tokens/"))
