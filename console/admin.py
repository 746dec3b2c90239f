from __future__ import annotations

from django.contrib import admin, messages

from console.lib.admin import ReadOnlyAdmin
from console.models import AgentPrincipal, Event, Membership, Tenant


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "max_tier"]
    list_filter = ["role", "tenant", "max_tier"]
    search_fields = ["user__username"]


@admin.register(AgentPrincipal)
class AgentPrincipalAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "token_prefix", "is_active", "created_at"]
    list_filter = ["tenant", "is_active"]
    readonly_fields = ["token_prefix", "created_at"]
    filter_horizontal = ["allowed_tools"]
    actions = ["rotate_token"]

    def save_model(self, request, obj, form, change):
        if not change:
            token = obj.set_token()
            messages.warning(request, f"Token for {obj.name} (shown once): {token}")
        super().save_model(request, obj, form, change)

    @admin.action(description="Rotate token (the new one is shown once)")
    def rotate_token(self, request, queryset):
        for principal in queryset:
            token = principal.set_token()
            principal.save(update_fields=["token_hash", "token_prefix"])
            messages.warning(request, f"New token for {principal.name} (shown once): {token}")


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id", "entity", "entity_id", "kind", "from_status", "to_status", "actor", "created_at"]
    list_filter = ["entity", "kind", "to_status"]
    search_fields = ["entity_id", "actor"]
