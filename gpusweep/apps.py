from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_role_groups(**kwargs: Any) -> None:
    """Create the role groups after every migrate (and every test flush, which re-sends post_migrate)."""
    from django.contrib.auth.models import Group

    from gpusweep.roles import Role

    for role in Role:
        Group.objects.get_or_create(name=role.value)


class GpusweepConfig(AppConfig):
    name = "gpusweep"
    verbose_name = "gpusweep core"

    def ready(self) -> None:
        post_migrate.connect(ensure_role_groups, sender=self, dispatch_uid="gpusweep.ensure_role_groups")
        from gpusweep import datagen

        datagen.install()  # a trigger on every table raises its generation (cached answers: gpusweep.responses)
