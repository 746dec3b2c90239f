from __future__ import annotations

from django import forms
from django.contrib import admin

from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    EscalationRule,
    Notification,
    NotificationChannel,
    PolicyTier,
    Tool,
)
from approvals.tools import tool_config_errors, tool_save
from console.lib.admin import ReadOnlyAdmin
from ledger.adapters import ADAPTERS, HTTP_ADAPTER


class EscalationRuleInline(admin.TabularInline):
    model = EscalationRule
    extra = 0


class ToolAdminForm(forms.ModelForm):
    """The tool's configuration is checked as a whole (approvals.tools), and each problem is
    shown on the field it is about."""

    class Meta:
        model = Tool
        fields = "__all__"  # noqa: DJ007 - the admin passes its own list (every field but schema_version)

    def clean(self) -> dict:
        cleaned = super().clean()
        candidate = Tool(**{field.name: cleaned.get(field.name, getattr(self.instance, field.name))
                            for field in Tool._meta.concrete_fields if field.name != "id"})
        known = {*ADAPTERS, HTTP_ADAPTER}
        if candidate.adapter and candidate.adapter not in known:
            self.add_error("adapter", f"No adapter {candidate.adapter!r}; known: {', '.join(sorted(known))}.")
        for field, messages in tool_config_errors(candidate).items():
            for message in messages:
                self.add_error(field if field in self.fields else None, message)
        return cleaned


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    form = ToolAdminForm
    list_display = ["name", "adapter", "kind", "base_tier", "idempotency", "queue", "schema_version", "enabled"]
    list_filter = ["adapter", "kind", "base_tier", "idempotency", "queue", "enabled"]
    search_fields = ["name", "description"]
    # Bumped by tool_save when the schema or the request's shape changes, never typed.
    readonly_fields = ["schema_version"]
    inlines = [EscalationRuleInline]

    def save_model(self, request, obj: Tool, form, change: bool) -> None:
        tool_save(tool=obj)


@admin.register(PolicyTier)
class PolicyTierAdmin(admin.ModelAdmin):
    list_display = ["level", "requirement", "shows_preview", "approval_ttl_seconds", "description"]


@admin.register(EscalationRule)
class EscalationRuleAdmin(admin.ModelAdmin):
    list_display = ["tool", "argument_path", "comparison", "value", "tier"]
    list_filter = ["tool", "tier"]


class DecisionInline(admin.TabularInline):
    model = ApprovalDecision
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class NotificationInline(admin.TabularInline):
    model = Notification
    extra = 0
    can_delete = False
    fields = ["kind", "channel", "status", "attempts", "last_error", "next_attempt_at", "sent_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["approval_id", "tenant", "call_id", "risk_tier", "status", "approvals_needed", "expires_at"]
    list_filter = ["status", "risk_tier", "tenant"]
    search_fields = ["approval_id", "call_id", "operation__operation_id", "task__task_id"]
    inlines = [DecisionInline, NotificationInline]


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(ReadOnlyAdmin):
    list_display = ["request", "reviewer", "verdict", "created_at"]
    list_filter = ["verdict"]


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ["audience", "tier", "kind", "target", "tenant", "enabled", "description"]
    list_filter = ["audience", "tier", "kind", "enabled", "tenant"]
    list_editable = ["enabled"]
    search_fields = ["target", "description"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    """Deliveries are evidence: every failure stays visible (`errors`), nobody edits them."""

    list_display = ["kind", "approval", "operation", "operation_status", "channel", "status", "attempts", "last_error",
                    "next_attempt_at", "sent_at"]
    list_filter = ["kind", "status", "channel__kind", "channel__tier"]
    search_fields = ["approval__approval_id", "operation__operation_id", "channel__target", "last_error"]
