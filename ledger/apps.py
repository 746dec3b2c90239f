from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"

    def ready(self) -> None:
        # Registers the support console's live streams ("unknown", "operation").
        from ledger import (
            control_live,  # noqa: F401  (the stops page's stream)
            live,  # noqa: F401
        )
