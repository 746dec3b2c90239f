from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"

    def ready(self) -> None:
        # Registers the reviewer console's live streams ("inbox", "approval").
        from approvals import live  # noqa: F401
