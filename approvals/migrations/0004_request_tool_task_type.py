# The inbox filters by tool and task type on the request itself (no join to 100,000
# operations). Three steps: add the columns (nullable), copy them from the operation and the
# task, then make them required and index them. Separate migrations because PostgreSQL refuses
# to ALTER a table with pending deferred-constraint checks from an UPDATE in the same transaction.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0003_notifications'),
    ]

    operations = [
        migrations.AddField(
            model_name='approvalrequest',
            name='tool',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='approvals.tool'),
        ),
        migrations.AddField(
            model_name='approvalrequest',
            name='task_type',
            field=models.CharField(default='', max_length=100),
            preserve_default=False,
        ),
    ]
