from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("campaigns", "0009_stranded_workloads"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodesweep",
            name="waiting_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
