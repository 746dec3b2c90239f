from django.core.management.base import BaseCommand

from console.demo import ensure_demo_data


class Command(BaseCommand):
    help = "Create the demo tenant, users, agent token, default tiers and tools (embedded mode only)."

    def handle(self, *args, **options):
        ensure_demo_data()
        self.stdout.write(self.style.SUCCESS("Demo data is in place."))
