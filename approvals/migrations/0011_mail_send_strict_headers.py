"""The seeded mail.send tool of an existing (embedded) database gets the subject rule of
approvals/defaults.py: no line break or control character. Only a schema still equal to the
one seeded before is changed; a schema an administrator edited is left alone. (Strict "email"
needs no migration: it is the gate's format check, approvals/formats.py.)"""

from django.db import migrations

OLD_SUBJECT = {"type": "string", "minLength": 1, "maxLength": 200}
HEADER_TEXT = {"not": {"pattern": "[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]"}}


def forward(apps, schema_editor):
    Tool = apps.get_model("approvals", "Tool")
    for tool in Tool.objects.filter(name="mail.send"):
        subject = (tool.json_schema or {}).get("properties", {}).get("subject")
        if subject == OLD_SUBJECT:
            tool.json_schema["properties"]["subject"] = {**OLD_SUBJECT, **HEADER_TEXT}
            tool.save(update_fields=["json_schema"])


class Migration(migrations.Migration):

    dependencies = [("approvals", "0010_alerts_reminders_and_support_channels")]

    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
