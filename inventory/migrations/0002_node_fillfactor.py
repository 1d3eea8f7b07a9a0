"""PostgreSQL only: leave room in node pages so last_seen/state updates are HOT (no index writes).

A full sync may touch every node row; with the default fillfactor (100) each such update also
rewrites all eight node indexes. At 50 the new row version fits on the same page.
"""

from django.db import migrations


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE inventory_node SET (fillfactor = 50)")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE inventory_node RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("inventory", "0001_initial")]
    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
