from django.db import migrations
from django.db.models import OuterRef, Subquery


def backfill(apps, schema_editor):
    ApprovalRequest = apps.get_model("approvals", "ApprovalRequest")
    Operation = apps.get_model("ledger", "Operation")
    Task = apps.get_model("runs", "Task")
    # Two set-based UPDATEs, whatever the number of rows.
    ApprovalRequest.objects.update(
        tool_id=Subquery(Operation.objects.filter(pk=OuterRef("operation_id")).values("tool_id")[:1]),
        task_type=Subquery(Task.objects.filter(pk=OuterRef("task_id")).values("task_type")[:1]),
    )


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0004_request_tool_task_type'),
        ('ledger', '0001_initial'),
        ('runs', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
