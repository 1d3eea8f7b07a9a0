"""Each exposure carries its node's cluster (the exposure list's cluster filter without a node join):
added empty, filled from the nodes, then required."""

import django.db.models.deletion
from django.db import migrations, models


def fill(apps, schema_editor):
    Exposure = apps.get_model("advisories", "Exposure")
    Node = apps.get_model("inventory", "Node")
    Exposure.objects.filter(cluster__isnull=True).update(
        cluster_id=models.Subquery(Node.objects.filter(pk=models.OuterRef("node_id")).values("cluster_id")[:1]))
    # An exposure whose node is gone already (the recompute drops such orphans) has no cluster to carry.
    Exposure.objects.filter(cluster__isnull=True).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("advisories", "0010_product_rows"),
        ("inventory", "0015_workload_placement"),
    ]

    operations = [
        migrations.AddField(
            model_name="exposure",
            name="cluster",
            field=models.ForeignKey(db_constraint=False, db_index=False, null=True,
                                    on_delete=django.db.models.deletion.DO_NOTHING, related_name="+",
                                    to="inventory.cluster"),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="exposure",
            name="cluster",
            field=models.ForeignKey(db_constraint=False, db_index=False,
                                    on_delete=django.db.models.deletion.DO_NOTHING, related_name="+",
                                    to="inventory.cluster"),
        ),
    ]
