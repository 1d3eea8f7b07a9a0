# Three branches (the console, the API's indexes, the deadline task) each added a 0005.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("advisories", "0005_deadline_policy_generation"),
        ("advisories", "0005_exposure_list_idx"),
        ("advisories", "0005_policy_changed_event"),
    ]

    operations: list[migrations.operations.base.Operation] = []
