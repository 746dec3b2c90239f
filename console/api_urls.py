"""The agent API (/api/v1/): each app contributes its endpoints."""

from __future__ import annotations

from django.urls import path

from approvals import api as approvals_api
from ledger import api as ledger_api
from ledger import control_api
from runs import api as runs_api

urlpatterns = [
    # An agent's calls first (each resolves its URL): the proposal, then the long-poll. Async
    # (not DRF): a long-poll sleeps on the event loop instead of holding a thread. A call ID may
    # hold any printable character, `/` included (sent URL-encoded). No two patterns overlap,
    # so the order changes only how soon a path is found.
    path("tasks/<str:task_id>/calls", ledger_api.propose_call, name="api-call-propose"),
    path("calls/<path:call_id>", ledger_api.call_get, name="api-call-get"),
    path("tasks", runs_api.TaskCreateApi.as_view(), name="api-task-create"),
    path("tasks/<str:task_id>", runs_api.TaskGetApi.as_view(), name="api-task-get"),
    path("tasks/<str:task_id>/lease", runs_api.TaskLeaseApi.as_view(), name="api-task-lease"),
    path("tasks/<str:task_id>/transition", runs_api.TaskTransitionApi.as_view(), name="api-task-transition"),
    path("operations/<str:operation_id>", ledger_api.OperationGetApi.as_view(), name="api-operation-get"),
    path("tools", approvals_api.ToolListApi.as_view(), name="api-tool-list"),
    # For people (admins, and L4 reviewers for a tool), not agents.
    path("stops", control_api.StopListApi.as_view(), name="api-stops"),
    path("stops/<str:stop_id>/resume", control_api.StopResumeApi.as_view(), name="api-stop-resume"),
]
