"""A trigram index for the inbox's search by ID (approvals.models.ApprovalRequest says why),
PostgreSQL only: pg_trgm and GIN do not exist on SQLite, where the search keeps reading the
pending requests."""

import importlib

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations, models
from django.db.models.functions import Upper

recreate_sqlite_pending_count_triggers = importlib.import_module(
    "approvals.migrations.0018_pending_count").recreate_sqlite_pending_count_triggers


class PostgresAddIndex(migrations.AddIndex):
    """AddIndex on PostgreSQL; on any other database only the model state changes."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0018_pending_count"),
    ]

    operations = [
        TrigramExtension(),  # nothing on SQLite
        PostgresAddIndex(
            model_name="approvalrequest",
            index=GinIndex(
                OpClass(Upper("approval_id"), name="gin_trgm_ops"),
                OpClass(Upper("call_id"), name="gin_trgm_ops"),
                OpClass(Upper("operation_id"), name="gin_trgm_ops"),
                OpClass(Upper("task_id"), name="gin_trgm_ops"),
                condition=models.Q(status="pending"), name="approval_search_trgm_idx",
            ),
        ),
        # SQLite would drop the pending-count triggers if this ever rebuilt the table.
        migrations.RunPython(recreate_sqlite_pending_count_triggers, migrations.RunPython.noop),
    ]
