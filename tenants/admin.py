"""Django admin for platform staff: tiers, tenants, memberships, API keys."""

from django.contrib import admin, messages
from django.http import HttpRequest

from tenants.models import ApiKey, Invitation, Membership, Tenant, Tier
from tenants.services import api_key_create, api_key_revoke


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "display_name",
        "rpm",
        "tpm",
        "monthly_token_quota",
        "max_context_tokens",
        "max_output_tokens",
        "max_concurrent_requests",
        "scheduling_weight",
        "priority",
        "queue_sla_seconds",
        "api_access",
        "priority_service_tier",
        "auto_service_tier",
    ]
    ordering = ["priority"]


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]
    readonly_fields = ["created_at"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "slug",
        "tier",
        "is_active",
        "monthly_budget",
        "budget_when_redis_down",
        "shadow_opt_in",
        "created_at",
    ]
    list_filter = ["tier", "is_active", "shadow_opt_in"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["created_at"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__name"]
    raw_id_fields = ["user"]
    list_select_related = ["user", "tenant"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "tenant",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        "rpm_limit",
        "tpm_limit",
    ]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter), "tenant__tier"]
    search_fields = ["name", "prefix", "tenant__name"]
    list_select_related = ["tenant"]
    # secret_hash is not editable and not listed here, so it never renders.
    fields = [
        "tenant",
        "name",
        "owner",
        "expires_at",
        "allowed_models",
        "rpm_limit",
        "tpm_limit",
        "prefix",
        "created_by",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke_keys"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None):
        readonly = ["prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
        # A key never moves between tenants: its usage history belongs to one.
        return [*readonly, "tenant"] if obj is not None else readonly

    def save_model(self, request: HttpRequest, obj: ApiKey, form, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        created, raw_key = api_key_create(
            tenant=obj.tenant,
            name=obj.name,
            created_by=request.user,
            owner=obj.owner,
            rpm_limit=obj.rpm_limit,
            tpm_limit=obj.tpm_limit,
            expires_at=obj.expires_at,
            allowed_models=obj.allowed_models,
        )
        # The admin redirects using obj, so it must become the saved row.
        for field in ("pk", "prefix", "secret_hash", "created_by", "created_at"):
            setattr(obj, field, getattr(created, field))
        obj._state.adding = False
        messages.warning(
            request,
            f"New API key, shown only this once; copy it now: {raw_key}",
        )

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request: HttpRequest, queryset) -> None:
        live = list(queryset.filter(revoked_at__isnull=True))
        for api_key in live:
            api_key_revoke(api_key=api_key)
        self.message_user(request, f"Revoked {len(live)} key(s).", messages.SUCCESS)


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    """Read-only: invitations are made and withdrawn by tenant admins in the console."""

    list_display = [
        "email",
        "tenant",
        "role",
        "created_at",
        "expires_at",
        "accepted_at",
        "revoked_at",
    ]
    list_filter = ["role", "tenant"]
    search_fields = ["email", "tenant__name"]
    readonly_fields = [f.name for f in Invitation._meta.fields if f.name != "token_hash"]
    exclude = ["token_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
