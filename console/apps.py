from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The pages that span apps (overview, settings), the base layout and the template tags. It
    imports no app: what each shows comes through gpusweep.registry."""

    name = "console"
