from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"

    def ready(self) -> None:
        from gpusweep import registry
        from inventory import overview, sections

        registry.overview.add(*overview.SECTIONS)
        registry.settings_page.add(*sections.SETTINGS)
