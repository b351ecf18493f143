from django.contrib import admin, messages

from fleet import services
from fleet.models import Deployment, Rollout, RoutingSettings, ServedModel, ShadowComparison
from wire.snapshot import SnapshotInvalid


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


class PublishOnSaveMixin:
    """Admin edits reach the data plane through a new snapshot."""

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        try:
            version = services.snapshot_publish()
        except SnapshotInvalid as exc:
            # E.g. one version's weight changed before the other's: saved,
            # but the data plane keeps the last valid snapshot until fixed.
            messages.warning(request, f"Saved, but the snapshot was not published: {exc}")
        else:
            messages.info(request, f"Published fleet snapshot version {version}.")


@admin.register(Deployment)
class DeploymentAdmin(PublishOnSaveMixin, admin.ModelAdmin):
    list_display = ["model_name", "version", "state", "traffic_weight", "replicas", "hourly_price"]
    list_filter = ["state", "model_name"]


@admin.register(RoutingSettings)
class RoutingSettingsAdmin(PublishOnSaveMixin, admin.ModelAdmin):
    list_display = ["max_kv_usage", "max_queue", "successors", "warm_reserve", "updated_at"]


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    list_display = ["model_name", "stable_version", "canary_version", "state", "step_index"]
    list_filter = ["state"]
    readonly_fields = ["results", "reason", "started_at", "finished_at", "grace_until"]
    actions = ["roll_back"]

    @admin.action(description="Roll back to the stable version")
    def roll_back(self, request, queryset):
        for rollout in queryset:
            services.rollout_rollback(rollout_id=rollout.pk)


@admin.register(ShadowComparison)
class ShadowComparisonAdmin(admin.ModelAdmin):
    list_display = ["response_id", "stable_version", "canary_version", "identical", "created_at"]
    list_filter = ["identical", "canary_version"]
