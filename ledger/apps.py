from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"

    def ready(self) -> None:
        # Registers the support console's live streams ("unknown", "operation").
        from ledger import live  # noqa: F401
