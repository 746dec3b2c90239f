"""`python manage.py audit_export_key`: print the approval receipts' HMAC key (AUDIT_SIGNING_KEY)
for an auditor who checks receipts offline (docs/security.md says what bytes are signed).

The key lets its holder forge receipts as well as check them: hand it only to the auditor, over
a channel fit for a secret.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Print AUDIT_SIGNING_KEY (the approval receipts' HMAC-SHA256 key, UTF-8) for offline verification."

    def handle(self, *args, **options):
        self.stderr.write("This key can forge approval receipts as well as check them; keep it secret.")
        self.stdout.write(settings.AUDIT_SIGNING_KEY)
