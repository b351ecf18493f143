"""Admin: prices and budget policies are edited; usage, invoices and samples are read-only."""

from django.contrib import admin, messages
from django.http import HttpRequest

from billing.models import (
    BudgetAlert,
    BudgetPolicy,
    DailyUsage,
    GpuUsageSample,
    Invoice,
    InvoiceLine,
    Price,
    UsageDeadLetter,
    UsageRecord,
)
from billing.selectors.invoices import invoice_differences
from billing.services import usage_dead_letter_retry


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
        "tier",
        "price",
        "ttft_ms",
        "duration_ms",
        "created_at",
    ]
    list_filter = ["source", "status", "finish_reason", "model", "tier", "tenant"]
    search_fields = ["response_id", "tenant__name", "api_key__prefix", "worker_id"]
    date_hierarchy = "created_at"
    list_select_related = ["tenant", "api_key", "tier", "price"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(UsageDeadLetter)
class UsageDeadLetterAdmin(admin.ModelAdmin):
    """Usage entries the settler set aside: fix the cause, then retry (or delete)."""

    list_display = ["created_at", "reason", "response_id", "entry_id", "error"]
    list_filter = ["reason"]
    search_fields = ["response_id", "entry_id", "error"]
    readonly_fields = ["entry_id", "response_id", "reason", "error", "payload", "created_at"]
    actions = ["retry"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    @admin.action(description="Settle the selected entries again")
    def retry(self, request: HttpRequest, queryset) -> None:
        letters = list(queryset)
        settled = sum(usage_dead_letter_retry(letter=letter) for letter in letters)
        failed = len(letters) - settled
        level = messages.SUCCESS if not failed else messages.WARNING
        self.message_user(request, f"{settled} settled, {failed} set aside again.", level)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Derived or issued rows: rebuilt by tasks, never edited by hand."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Prices are added, not edited: a change is a new row with a later date."""

    list_display = [
        "model",
        "tier",
        "effective_from",
        "prompt_per_million",
        "cached_prompt_per_million",
        "completion_per_million",
        "priority_multiplier",
        "flex_multiplier",
    ]
    list_filter = ["tier", "model"]
    date_hierarchy = "effective_from"

    def get_readonly_fields(self, request: HttpRequest, obj=None):
        # A price that may already be billed must not change under its invoices.
        return [f.name for f in Price._meta.fields] if obj is not None else []


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in InvoiceLine._meta.fields]

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    list_display = ["number", "tenant", "period", "total", "currency", "issued_at"]
    list_filter = ["period", "tenant__tier"]
    search_fields = ["number", "tenant__name"]
    inlines = [InvoiceLineInline]
    readonly_fields = ["reproduces"]

    @admin.display(description="Reproduces from the usage records")
    def reproduces(self, obj: Invoice) -> str:
        differences = invoice_differences(invoice=obj)
        return "yes" if not differences else "NO: " + "; ".join(differences)


@admin.register(BudgetPolicy)
class BudgetPolicyAdmin(admin.ModelAdmin):
    list_display = ["tenant", "soft_alert_ratio", "alert_email"]
    search_fields = ["tenant__name"]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "period", "kind", "spend", "budget", "recipients", "sent_at"]
    list_filter = ["kind", "period"]


@admin.register(DailyUsage)
class DailyUsageAdmin(ReadOnlyAdmin):
    list_display = [
        "day",
        "tenant",
        "api_key",
        "model",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "cost",
    ]
    list_filter = ["day", "model"]
    list_select_related = ["tenant", "api_key"]


@admin.register(GpuUsageSample)
class GpuUsageSampleAdmin(ReadOnlyAdmin):
    list_display = [
        "sampled_at",
        "worker_id",
        "model",
        "busy_seconds",
        "idle_seconds",
        "hourly_price",
    ]
    list_filter = ["day", "model"]
    search_fields = ["worker_id"]
