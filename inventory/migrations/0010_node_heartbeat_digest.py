from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0009_node_heartbeat_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='heartbeat_digest',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
    ]
