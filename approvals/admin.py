from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect

from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    AuditReview,
    BudgetCap,
    EscalationRule,
    Notification,
    NotificationChannel,
    PolicyTier,
    Stop,
    StopStatus,
    Tool,
)
from approvals.stops import stop_create
from approvals.tools import tool_config_errors, tool_save
from console.lib.admin import ReadOnlyAdmin
from console.lib.errors import DomainError
from ledger.adapters import ADAPTERS, HTTP_ADAPTER, MCP_ADAPTER
from ledger.control import stop_resume


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
        known = {*ADAPTERS, HTTP_ADAPTER, MCP_ADAPTER}
        if candidate.adapter and candidate.adapter not in known:
            self.add_error("adapter", f"No adapter {candidate.adapter!r}; known: {', '.join(sorted(known))}.")
        for field, problems in tool_config_errors(candidate).items():
            for message in problems:
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


@admin.register(BudgetCap)
class BudgetCapAdmin(admin.ModelAdmin):
    """Ceilings a task contract can only lower (approvals.caps); per day in the tenant's time zone."""

    list_display = ["__str__", "calls_per_task", "writes_per_task", "amount_per_task", "calls_per_day",
                    "writes_per_day", "amount_per_day", "description"]
    list_filter = ["tenant"]
    fieldsets = [
        (None, {"fields": ["tenant", "agent", "tool", "description"],
                "description": "Leave agent and tool empty to cap the whole tenant; name one of them to cap it alone."}),
        ("Per task", {"fields": ["calls_per_task", "writes_per_task", "amount_per_task"]}),
        ("Per day (the tenant's time zone)", {"fields": ["calls_per_day", "writes_per_day", "amount_per_day"]}),
        ("Model cost (tenant and agent caps)", {
            "fields": ["cost_currency", "cost_per_task", "cost_per_day"],
            "description": "The agent's model spend from its spans at the model prices; known after each model "
                           "call, so once a cap is spent the next tool call is refused."}),
    ]


@admin.register(AuditReview)
class AuditReviewAdmin(ReadOnlyAdmin):
    list_display = ["operation", "tenant", "tool", "risk_tier", "status", "reviewed_by", "reviewed_at", "created_at"]
    list_filter = ["status", "tenant"]
    search_fields = ["operation__operation_id", "call_id", "note"]


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


class StopForm(forms.ModelForm):
    class Meta:
        model = Stop
        fields = ["tenant", "scope", "agent", "tool", "reason"]


@admin.register(Stop)
class StopAdmin(admin.ModelAdmin):
    """Stops are added through `stop_create` (its checks, its event) and ended by the resume
    action (`ledger.control.stop_resume`); a saved stop is never edited or deleted."""

    form = StopForm
    list_display = ["stop_id", "tenant", "scope", "agent", "tool", "status", "stopped_by", "created_at", "reason",
                    "resumed_by", "resumed_at"]
    list_filter = ["status", "scope", "tenant"]
    search_fields = ["stop_id", "reason", "resume_reason"]
    actions = ["resume_selected"]

    def has_change_permission(self, request, obj=None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        try:
            created = stop_create(tenant_id=obj.tenant_id, scope=obj.scope, agent=obj.agent, tool=obj.tool,
                                  user=request.user, reason=obj.reason)
        except DomainError as exc:
            raise ValidationError(exc.message) from exc
        obj.pk, obj.stop_id, obj._state.adding = created.pk, created.stop_id, False

    def add_view(self, request, form_url="", extra_context=None):
        try:
            return super().add_view(request, form_url, extra_context)
        except ValidationError as exc:
            self.message_user(request, " ".join(exc.messages), level=messages.ERROR)
            return HttpResponseRedirect(request.path)

    @admin.action(description="Resume the selected stops")
    def resume_selected(self, request, queryset) -> None:
        resumed = 0
        for stop_id in queryset.filter(status=StopStatus.STOPPED).values_list("stop_id", flat=True):
            try:
                stop_resume(stop_id=stop_id, user=request.user, reason="resumed in the admin")
                resumed += 1
            except DomainError as exc:
                self.message_user(request, f"{stop_id}: {exc.message}", level=messages.ERROR)
        self.message_user(request, f"Resumed {resumed} stop(s).")
