"""`python manage.py audit_verify [--tenant SLUG]`: check the event log's hash chains.

Every chain (one per tenant, one for events with no tenant), or the named tenant's: each row
must hash to its `hash`, name the hash of the row before, follow it in `chain_seq` without a
gap or a repeat, and the chain's head must agree with its last row. First the rows committed
and not sealed yet are sealed (on PostgreSQL the sealer links them a moment after their commit),
so the check covers every row committed before it. Prints the first broken link of each chain (a
changed, removed, inserted or moved row). Then every approval decision's signed
receipt (all tenants). Exit status 0 when every chain checked is whole and every receipt holds,
1 otherwise.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from console.lib import audit
from console.models import Tenant


class Command(BaseCommand):
    help = "Check the event log's hash chains; exit 0 if whole, 1 at the first broken link of any chain."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", default="", help="Only this tenant's chain (its slug).")

    def handle(self, *args, tenant: str = "", **options):
        if tenant:
            found = Tenant.objects.filter(slug=tenant).values_list("pk", flat=True).first()
            if found is None:
                raise CommandError(f"No tenant {tenant!r}.")
            chains = audit.chains([found])
        else:
            chains = audit.chains()
        self.stdout.write(f"{audit.seal_pending()} row(s) sealed before the check.")
        broken = 0
        for tenant_id in chains:
            result = audit.verify_chain(tenant_id)
            if result is None:
                self.stdout.write(f"{audit.chain_of(tenant_id)}: whole")
            else:
                broken += 1
                self.stdout.write(f"BROKEN {result}")
        self.stdout.write(f"{len(chains)} chain(s) checked, {broken} broken.")
        forged = audit.forged_decisions()
        for line in forged:
            self.stdout.write(f"FORGED {line}")
        self.stdout.write(f"approval receipts: {len(forged)} do not hold.")
        raise SystemExit(1 if broken or forged else 0)
