"""Django admin for platform staff: the served-model catalog."""

from django.contrib import admin

from inference.models import ServedModel


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ["name", "context_length", "is_active", "tier_names", "created_at"]
    list_filter = ["is_active", "tiers"]
    search_fields = ["name", "description"]
    filter_horizontal = ["tiers"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("tiers")

    @admin.display(description="Tiers")
    def tier_names(self, obj: ServedModel) -> str:
        return ", ".join(tier.name for tier in obj.tiers.all())
