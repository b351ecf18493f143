"""Staff edit each tier's safety bounds and may inspect tenants' choices and events."""

from django.contrib import admin

from safety.models import SafetyEvent, TenantSafetyPolicy, TierSafetyPolicy
from safety.selectors import policy_cache_forget


@admin.register(TierSafetyPolicy)
class TierSafetyPolicyAdmin(admin.ModelAdmin):
    list_display = [
        "tier",
        "classifier_action",
        "classifier_threshold",
        "classifier_min_action",
        "classifier_max_threshold",
        "pii_action",
        "pii_min_action",
        "deny_action",
        "output_moderation",
        "output_required",
        "text_storage_allowed",
    ]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # Every tenant of the tier may resolve differently now.
        policy_cache_forget()


@admin.register(TenantSafetyPolicy)
class TenantSafetyPolicyAdmin(admin.ModelAdmin):
    list_display = ["tenant", "classifier_action", "pii_action", "deny_action", "store_text"]
    search_fields = ["tenant__name"]
    raw_id_fields = ["tenant"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        policy_cache_forget(tenant_id=obj.tenant_id)


@admin.register(SafetyEvent)
class SafetyEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "tenant", "stage", "outcome", "model", "source", "request_ref"]
    list_filter = ["stage", "outcome", "source"]
    search_fields = ["tenant__name", "request_ref"]
    # A record of what happened: never edited.
    readonly_fields = [f.name for f in SafetyEvent._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
