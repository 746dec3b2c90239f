"""Emergency stops, and their table watched by the configuration's generation triggers (as the
tools, rules and tiers are), so the gate reads the stops in force from its cache.

On SQLite a later migration that rebuilds approvals_stop (a NOT NULL column added, say) drops
these triggers with the old table: it must create them again, or stops go unseen by the cache."""

import importlib

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


_generation = importlib.import_module("approvals.migrations.0007_policy_generation")
TABLE = "approvals_stop"


def watch_stops(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(_generation.PG_TRIGGER.format(table=TABLE), params=None)
    elif vendor == "sqlite":
        for op in _generation.SQLITE_OPS:
            schema_editor.execute(_generation.SQLITE_TRIGGER.format(table=TABLE, op=op), params=None)
    else:
        raise RuntimeError(f"No policy-generation triggers for {vendor}: the gate's cache would go stale.")


def unwatch_stops(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_policy_generation ON {TABLE}", params=None)
    else:
        for op in _generation.SQLITE_OPS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_policy_generation_{op}", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0011_mail_send_strict_headers'),
        ('console', '0005_event_entity_stop'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Stop',
            fields=[
                ('stop_id', models.CharField(max_length=64, primary_key=True, serialize=False)),
                ('scope', models.CharField(choices=[('tenant', 'Tenant'), ('agent', 'Agent'), ('tool', 'Tool')], max_length=8)),
                ('scope_key', models.CharField(editable=False, max_length=40)),
                ('status', models.CharField(choices=[('stopped', 'Stopped'), ('resumed', 'Resumed')], default='stopped', max_length=8)),
                ('reason', models.TextField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('resumed_at', models.DateTimeField(blank=True, null=True)),
                ('resume_reason', models.TextField(blank=True)),
                ('agent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='console.agentprincipal')),
                ('resumed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('stopped_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='stops', to='console.tenant')),
                ('tool', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='approvals.tool')),
            ],
            options={
                'ordering': ['-created_at'],
                'indexes': [models.Index(fields=['tenant', 'status'], name='stop_tenant_status_idx')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('status', 'stopped')), fields=('tenant', 'scope_key'), name='stop_one_in_force_per_scope')],
            },
        ),
        migrations.RunPython(watch_stops, unwatch_stops),
    ]
