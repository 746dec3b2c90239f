"""The configuration's generation token, rewritten by triggers on every table the gate reads
(approvals.catalog caches by it). Statement-level on PostgreSQL (TRUNCATE included, which a
test database's flush uses); one trigger per table and operation on SQLite."""

from django.db import migrations, models

WATCHED = ("approvals_tool", "approvals_escalationrule", "approvals_policytier", "console_agentprincipal_allowed_tools")

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION approvals_policy_generation_bump() RETURNS trigger AS $$
BEGIN
    INSERT INTO approvals_policygeneration (id, token)
        VALUES (1, md5(random()::text || clock_timestamp()::text || txid_current()::text))
        ON CONFLICT (id) DO UPDATE SET token = EXCLUDED.token;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""
PG_TRIGGER = """
CREATE TRIGGER {table}_policy_generation
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION approvals_policy_generation_bump();
"""
SQLITE_TRIGGER = """
CREATE TRIGGER {table}_policy_generation_{op}
    AFTER {op} ON {table}
    BEGIN
        INSERT INTO approvals_policygeneration (id, token) VALUES (1, lower(hex(randomblob(16))))
            ON CONFLICT (id) DO UPDATE SET token = excluded.token;
    END;
"""
SQLITE_OPS = ("insert", "update", "delete")


def recreate_sqlite_tool_triggers(apps, schema_editor):
    """For later migrations that add a column to approvals_tool: SQLite does so by rebuilding
    the table, which drops its triggers; PostgreSQL keeps them through ADD COLUMN."""
    if schema_editor.connection.vendor != "sqlite":
        return
    for op in SQLITE_OPS:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS approvals_tool_policy_generation_{op}", params=None)
        schema_editor.execute(SQLITE_TRIGGER.format(table="approvals_tool", op=op), params=None)


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_FUNCTION, params=None)
        for table in WATCHED:
            schema_editor.execute(PG_TRIGGER.format(table=table), params=None)
    elif vendor == "sqlite":
        for table in WATCHED:
            for op in SQLITE_OPS:
                schema_editor.execute(SQLITE_TRIGGER.format(table=table, op=op), params=None)
    else:
        raise RuntimeError(f"No policy-generation triggers for {vendor}: the gate's cache would go stale.")


def backwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for table in WATCHED:
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_policy_generation ON {table}", params=None)
        else:
            for op in SQLITE_OPS:
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_policy_generation_{op}", params=None)
    if vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS approvals_policy_generation_bump()", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0006_request_filter_indexes"),
        ("console", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="PolicyGeneration",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("token", models.CharField(max_length=32)),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
