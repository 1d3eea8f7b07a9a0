from django.apps import AppConfig


class CampaignsConfig(AppConfig):
    name = "campaigns"

    def ready(self) -> None:
        from campaigns import overview, sections
        from gpusweep import registry

        registry.overview.add(*overview.SECTIONS)
        registry.node_page.add(*sections.NODE)
