from django.apps import AppConfig


class AdvisoriesConfig(AppConfig):
    name = "advisories"

    def ready(self) -> None:
        from advisories import overview, sections, signals  # noqa: F401  (signals connects the inventory hook)
        from gpusweep import registry

        registry.overview.add(*overview.SECTIONS)
        registry.settings_page.add(*sections.SETTINGS)
        registry.node_page.add(*sections.NODE)
