from __future__ import annotations

from django.contrib import admin

from console.lib.admin import ReadOnlyAdmin
from runs.models import Lease, ModelPrice, ReleaseGate, Step, Task


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ["task_id", "tenant", "task_type", "status", "version", "updated_at"]
    list_filter = ["status", "task_type", "tenant"]
    search_fields = ["task_id", "goal"]


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ["task", "step_id", "created_at"]


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["task", "owner", "generation", "fencing_token", "expires_at"]


@admin.register(ReleaseGate)
class ReleaseGateAdmin(admin.ModelAdmin):
    list_display = ["indicator", "comparison", "threshold", "task_type", "risk_tier", "tool", "split_by_task_type",
                    "split_by_risk_tier", "split_by_tool", "enabled", "description"]
    list_filter = ["indicator", "enabled"]
    list_editable = ["threshold", "enabled"]


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = ["model", "tenant", "input_per_million", "output_per_million", "currency", "valid_from"]
    list_filter = ["currency", "tenant"]
    search_fields = ["model"]
