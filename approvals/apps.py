from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"

    def ready(self) -> None:
        # The reviewer console's live streams ("inbox", "approval"), and the strict "email"
        # format for tool schemas on the format checker the gate uses.
        from approvals import formats, live  # noqa: F401
