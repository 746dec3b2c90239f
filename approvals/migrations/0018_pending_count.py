"""Pending approval requests per tenant and tier as deltas written by a trigger on
approvals_approvalrequest (approvals.models.PendingCount says why), and the deltas of the
requests pending now. One row trigger on PostgreSQL; one per operation on SQLite.

SQLite alters a table by rebuilding it, which drops its triggers: a later migration that changes
approvals_approvalrequest must end with RunPython(recreate_sqlite_pending_count_triggers) from
here (PostgreSQL keeps them)."""

from django.db import migrations, models

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION approvals_pending_count() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status = 'pending' AND NEW.status = 'pending'
                AND OLD.risk_tier = NEW.risk_tier AND OLD.tenant_id = NEW.tenant_id THEN
            RETURN NULL;
        END IF;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status = 'pending' THEN
            INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta) VALUES (OLD.tenant_id, OLD.risk_tier, -1);
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.status = 'pending' THEN
            INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta) VALUES (NEW.tenant_id, NEW.risk_tier, 1);
        END IF;
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""
PG_TRIGGER = """
CREATE TRIGGER approvals_pending_count
    AFTER INSERT OR DELETE OR UPDATE OF status, risk_tier, tenant_id ON approvals_approvalrequest
    FOR EACH ROW EXECUTE FUNCTION approvals_pending_count();
"""
SQLITE_TRIGGERS = {
    "insert": """
CREATE TRIGGER approvals_pending_count_insert AFTER INSERT ON approvals_approvalrequest
    WHEN NEW.status = 'pending'
    BEGIN
        INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta) VALUES (NEW.tenant_id, NEW.risk_tier, 1);
    END;
""",
    "delete": """
CREATE TRIGGER approvals_pending_count_delete AFTER DELETE ON approvals_approvalrequest
    WHEN OLD.status = 'pending'
    BEGIN
        INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta) VALUES (OLD.tenant_id, OLD.risk_tier, -1);
    END;
""",
    "update": """
CREATE TRIGGER approvals_pending_count_update AFTER UPDATE OF status, risk_tier, tenant_id ON approvals_approvalrequest
    WHEN (OLD.status = 'pending' OR NEW.status = 'pending')
        AND NOT (OLD.status = 'pending' AND NEW.status = 'pending'
                 AND OLD.risk_tier = NEW.risk_tier AND OLD.tenant_id = NEW.tenant_id)
    BEGIN
        INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta)
            SELECT OLD.tenant_id, OLD.risk_tier, -1 WHERE OLD.status = 'pending';
        INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta)
            SELECT NEW.tenant_id, NEW.risk_tier, 1 WHERE NEW.status = 'pending';
    END;
""",
}
BACKFILL = """
INSERT INTO approvals_pendingcount (tenant_id, risk_tier, delta)
    SELECT tenant_id, risk_tier, COUNT(*) FROM approvals_approvalrequest WHERE status = 'pending'
    GROUP BY tenant_id, risk_tier
"""


def recreate_sqlite_pending_count_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for op, statement in SQLITE_TRIGGERS.items():
        schema_editor.execute(f"DROP TRIGGER IF EXISTS approvals_pending_count_{op}", params=None)
        schema_editor.execute(statement, params=None)


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    # The trigger first: on PostgreSQL creating it locks out writers to the requests until this
    # migration commits, so no request moves between the backfill and the trigger.
    if vendor == "postgresql":
        schema_editor.execute(PG_FUNCTION, params=None)
        schema_editor.execute(PG_TRIGGER, params=None)
    elif vendor == "sqlite":
        recreate_sqlite_pending_count_triggers(apps, schema_editor)
    else:
        raise RuntimeError(f"No pending-count triggers for {vendor}: the inbox's counts would drift.")
    schema_editor.execute(BACKFILL, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TRIGGER IF EXISTS approvals_pending_count ON approvals_approvalrequest", params=None)
        schema_editor.execute("DROP FUNCTION IF EXISTS approvals_pending_count()", params=None)
    else:
        for op in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS approvals_pending_count_{op}", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0017_budget_cap_cost'),
    ]

    operations = [
        migrations.CreateModel(
            name='PendingCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tenant_id', models.BigIntegerField()),
                ('risk_tier', models.PositiveSmallIntegerField()),
                ('delta', models.IntegerField()),
            ],
            options={
                'indexes': [models.Index(fields=['tenant_id', 'risk_tier'], name='approval_pending_count_idx')],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
