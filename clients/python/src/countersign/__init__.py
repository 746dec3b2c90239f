"""Countersign's Python client: tasks, gated tool calls and their approvals."""

from countersign.aio import AsyncClient, AsyncTask
from countersign.client import Client, Task
from countersign.errors import (
    ApiError,
    CallError,
    Cancelled,
    CountersignError,
    CountersignUnavailable,
    Expired,
    Failed,
    LeaseLost,
    NotFinal,
    OutcomeUnknown,
    Refused,
    Rejected,
    StaleFencingToken,
    TaskFinished,
)
from countersign.otel import link_span

__all__ = [
    "ApiError", "AsyncClient", "AsyncTask", "CallError", "Cancelled", "Client", "CountersignError",
    "CountersignUnavailable", "Expired", "Failed", "LeaseLost", "NotFinal", "OutcomeUnknown", "Refused",
    "Rejected", "StaleFencingToken", "Task", "TaskFinished", "link_span",
]
