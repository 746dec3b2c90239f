from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"

    def ready(self) -> None:
        # Registers the support console's live streams ("unknown", "operation") and the stops
        # page's, and connects the worker heartbeats and beat's liveness watch (Celery signals).
        from ledger import (  # noqa: F401
            control_live,
            live,
            liveness,
        )
