from __future__ import annotations

from django import forms
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


class AgentPrincipalForm(forms.ModelForm):
    webhook_url = forms.URLField(required=False, max_length=500, assume_scheme="https",
                                 help_text=AgentPrincipal._meta.get_field("webhook_url").help_text)

    class Meta:
        model = AgentPrincipal
        fields = ["tenant", "name", "allowed_tools", "is_active", "api_rate_per_minute", "webhook_url",
                  "webhook_secret_ref", "webhook_disabled_at"]

    def clean(self):
        data = super().clean()
        if data.get("webhook_url") and not data.get("webhook_secret_ref"):
            self.add_error("webhook_secret_ref", "A webhook needs the name of the variable holding its signing secret.")
        ref = data.get("webhook_secret_ref") or ""
        if ref and not ref.replace("_", "").isalnum():
            self.add_error("webhook_secret_ref", "The name of an environment variable (letters, digits, _), "
                                                 "not the secret itself.")
        return data


@admin.register(AgentPrincipal)
class AgentPrincipalAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "token_prefix", "is_active", "webhook_url", "created_at"]
    list_filter = ["tenant", "is_active"]
    readonly_fields = ["token_prefix", "created_at"]
    filter_horizontal = ["allowed_tools"]
    actions = ["rotate_token"]
    form = AgentPrincipalForm

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
