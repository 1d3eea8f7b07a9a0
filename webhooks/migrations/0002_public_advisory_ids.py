"""Events kept before advisories had one public id named them by their database id
(``advisory:3``, ``advisory:3:1.2``, ``exposure.overdue:3:1:2026-12-01``): rewritten to the public id
(``advisory:nvidia-5703``), so a pending delivery sends it and an occurrence already announced keeps
its key (it is not announced again)."""

from __future__ import annotations

import re
from typing import Any

from django.db import migrations

from advisories.models import public_id

KEY = re.compile(r"^(advisory|exposure\.overdue|exposure\.due_soon):(\d+)(:.*)?$")


def forwards(apps: Any, schema_editor: Any) -> None:
    Advisory = apps.get_model("advisories", "Advisory")
    Event = apps.get_model("webhooks", "Event")
    names = {pk: public_id(publisher, number)
             for pk, publisher, number in Advisory.objects.values_list("pk", "publisher", "publisher_id")}
    for event in Event.objects.filter(subject__regex=r"^advisory:\d+$").iterator():
        found = names.get(int(event.subject.split(":", 1)[1]))
        if found is None:  # the advisory is gone: nothing to name it by
            continue
        event.subject = f"advisory:{found}"
        match = KEY.match(event.key)
        if match and int(match.group(2)) in names:
            event.key = f"{match.group(1)}:{names[int(match.group(2))]}{match.group(3) or ''}"[:200]
        event.save(update_fields=["subject", "key"])


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0001_initial"),
        ("advisories", "0010_product_rows"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
