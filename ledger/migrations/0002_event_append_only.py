"""On PostgreSQL, the event log refuses UPDATE and DELETE at the database itself."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION ledger_event_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'ledger_event is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER ledger_event_append_only
    BEFORE UPDATE OR DELETE ON ledger_event
    FOR EACH ROW EXECUTE FUNCTION ledger_event_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS ledger_event_append_only ON ledger_event;
DROP FUNCTION IF EXISTS ledger_event_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
