"""Read-only admin for usage records: billing history is never edited by hand."""

from django.contrib import admin
from django.http import HttpRequest

from billing.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    list_display = [
        "response_id",
        "tenant",
        "api_key",
        "model",
        "source",
        "status",
        "finish_reason",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "ttft_ms",
        "duration_ms",
        "created_at",
    ]
    list_filter = ["source", "status", "finish_reason", "model", "tenant__tier", "tenant"]
    search_fields = ["response_id", "tenant__name", "api_key__prefix", "worker_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "api_key"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
