"""The event log moves to the ground floor every app may import: the model changes app, the
table (`ledger_event`, with its append-only trigger) stays as it is."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0001_initial"),
        ("ledger", "0007_tool_circuit"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Event",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("entity", models.CharField(max_length=32)),
                        ("entity_id", models.CharField(max_length=64)),
                        ("from_status", models.CharField(blank=True, max_length=32)),
                        ("to_status", models.CharField(max_length=32)),
                        ("actor", models.CharField(max_length=160)),
                        ("reason", models.TextField(blank=True)),
                        ("evidence", models.JSONField(blank=True, default=dict)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("tenant", models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT,
                                                     related_name="+", to="console.tenant")),
                    ],
                    options={
                        "db_table": "ledger_event",
                        "indexes": [
                            models.Index(fields=["entity", "entity_id", "id"], name="event_entity_idx"),
                            models.Index(fields=["tenant", "id"], name="event_tenant_idx"),
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
