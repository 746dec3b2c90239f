from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "ledger"

    def ready(self) -> None:
        # Registers the support console's live streams ("unknown", "operation"), and connects the
        # worker heartbeats and beat's liveness watch (Celery signals).
        from ledger import live, liveness  # noqa: F401
