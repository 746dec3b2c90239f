from __future__ import annotations

from django.contrib import admin

from console.lib.admin import ReadOnlyAdmin
from ledger.models import (
    Attempt,
    Call,
    LivenessAlert,
    Operation,
    WebhookDelivery,
    WebhookEvent,
    WorkerHeartbeat,
)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class AttemptInline(ReadOnlyInline):
    model = Attempt


class WebhookDeliveryInline(ReadOnlyInline):
    model = WebhookDelivery
    fields = ["number", "started_at", "status_code", "error", "duration_ms", "next_retry_at", "url", "response_body"]


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["operation_id", "tenant", "tool", "status", "risk_tier", "attempt_count", "updated_at"]
    list_filter = ["status", "tool", "tenant", "risk_tier"]
    search_fields = ["operation_id", "call_id", "task__task_id", "idempotency_key"]
    inlines = [AttemptInline]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["operation", "number", "fencing_token", "fact", "error_class", "latency_ms", "stale"]
    list_filter = ["fact", "stale"]


@admin.register(Call)
class CallAdmin(ReadOnlyAdmin):
    list_display = ["call_id", "task", "operation", "created_at"]
    search_fields = ["call_id", "operation__operation_id"]


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ["name", "pool", "queues", "pid", "started_at", "seen_at", "progressed_at", "tasks_done"]


@admin.register(LivenessAlert)
class LivenessAlertAdmin(ReadOnlyAdmin):
    list_display = ["raised_at", "cleared_at", "oldest_due_seconds", "due_count"]


@admin.register(WebhookEvent)
class WebhookEventAdmin(ReadOnlyAdmin):
    """The decision webhooks sent to agents, each with its delivery attempts."""

    list_display = ["webhook_id", "kind", "call_id", "operation_status", "principal", "status", "attempts",
                    "next_attempt_at", "created_at"]
    list_filter = ["status", "kind", "tenant"]
    search_fields = ["webhook_id", "call_id", "operation__operation_id"]
    inlines = [WebhookDeliveryInline]
