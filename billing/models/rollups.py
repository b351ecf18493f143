"""Daily usage roll-ups: one row per day, tenant, key and model."""

from django.db import models


class DailyUsage(models.Model):
    """A day's billable usage of one tenant, key and model, priced exactly.

    Rebuilt from the UsageRecords by ``daily_usage_rollup`` (a rerun
    replaces the day's rows), so it is a cache of the records, never a
    source of truth. ``api_key`` is null for console usage.
    """

    day = models.DateField()
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(
        "tenants.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    model = models.CharField(max_length=128)
    requests = models.PositiveIntegerField()
    prompt_tokens = models.PositiveBigIntegerField()
    cached_tokens = models.PositiveBigIntegerField()
    completion_tokens = models.PositiveBigIntegerField()
    cost = models.DecimalField(max_digits=24, decimal_places=16)
    # The price the cost was computed at (None: no price in force, cost 0).
    price = models.ForeignKey(
        "billing.Price", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-day", "tenant", "model"]
        verbose_name_plural = "daily usage"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "tenant", "api_key", "model"],
                name="daily_usage_unique",
                nulls_distinct=False,
            )
        ]
        indexes = [models.Index(fields=["tenant", "day"], name="daily_usage_tenant_day_idx")]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id} {self.model}"
