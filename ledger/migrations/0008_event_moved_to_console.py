"""The event log's model now belongs to `console` (console 0002); its table stays."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("ledger", "0007_tool_circuit"),
        ("console", "0002_event"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="Event")],
            database_operations=[],
        ),
    ]
