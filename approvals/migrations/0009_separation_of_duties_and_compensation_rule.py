"""Who proposed a call (ApprovalRequest.proposed_by) and what may compensate a tool's effects
(Tool.compensation_rule).

Adding a column with a default makes SQLite rebuild `approvals_tool`, which drops the
policy-generation triggers created in 0007: they are created again here, or the gate's cache
would no longer see changes to tools."""

import importlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


generation = importlib.import_module("approvals.migrations.0007_policy_generation")


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0008_tool_http_configuration'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='approvalrequest',
            name='proposed_by',
            field=models.ForeignKey(blank=True, help_text='The person who proposed this call; never one of its approvers. Empty: the agent did.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='tool',
            name='compensation_rule',
            field=models.JSONField(blank=True, default=dict, help_text='Which tools may compensate this tool\'s effects, and which of their arguments must match the original call: {"payments.refund": {"order_id": "same", "currency": "same", "amount": "at_most"}}. "same": equal to the original\'s; "at_most": a number no larger. Empty: no compensating operation can be proposed; support settles such cases by hand.'),
        ),
        migrations.RunPython(generation.recreate_sqlite_tool_triggers, migrations.RunPython.noop),
    ]
