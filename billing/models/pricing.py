"""Prices per model and tier, with the date from which each applies."""

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models

MULTIPLIER = {
    "max_digits": 6,
    "decimal_places": 3,
    "validators": [MinValueValidator(Decimal(0))],
}

UNIT_PRICE = {
    "max_digits": 20,
    "decimal_places": 10,
    "validators": [MinValueValidator(Decimal(0))],
}


class Price(models.Model):
    """What one million tokens of ``model`` cost on ``tier`` from ``effective_from`` on.

    A price change is a new row: the row in force on a day is the one with
    the latest ``effective_from`` not after that day, so history stays
    reproducible. Unit prices keep ten decimal places and are never
    rounded; only invoice amounts are (see ``Invoice``). Cached prompt
    tokens (served from the prefix cache) are billed at
    ``cached_prompt_per_million``, the rest of the prompt at
    ``prompt_per_million``.

    A response served at OpenAI's ``service_tier`` "priority" or "flex"
    (``UsageRecord.service_tier``) costs the whole price times that class's
    multiplier; "default" (and the Batch API's class) at 1.
    """

    model = models.CharField(max_length=128, help_text="Served model name.")
    tier = models.ForeignKey("tenants.Tier", on_delete=models.PROTECT, related_name="prices")
    effective_from = models.DateField(help_text="First day (UTC) this price applies.")
    prompt_per_million = models.DecimalField(**UNIT_PRICE)
    cached_prompt_per_million = models.DecimalField(**UNIT_PRICE)
    completion_per_million = models.DecimalField(**UNIT_PRICE)
    priority_multiplier = models.DecimalField(
        **MULTIPLIER,
        default=Decimal(2),
        help_text="What service_tier 'priority' costs, times the prices above.",
    )
    flex_multiplier = models.DecimalField(
        **MULTIPLIER,
        default=Decimal("0.5"),
        help_text="What service_tier 'flex' costs, times the prices above.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "tier", "-effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["model", "tier", "effective_from"], name="price_model_tier_from_unique"
            )
        ]

    def __str__(self) -> str:
        # The tier by name: this is what the audit log keeps of a price.
        return f"{self.model} on {self.tier} from {self.effective_from}"

    def multiplier(self, service_tier: str) -> Decimal:
        """The factor a response served at ``service_tier`` pays."""
        return service_tier_multiplier(
            service_tier, priority=self.priority_multiplier, flex=self.flex_multiplier
        )

    def cost(
        self,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        service_tier: str = "default",
    ) -> Decimal:
        """The exact (unrounded) cost of these token counts at this price."""
        return (
            (
                (prompt_tokens - cached_tokens) * self.prompt_per_million
                + cached_tokens * self.cached_prompt_per_million
                + completion_tokens * self.completion_per_million
            )
            * self.multiplier(service_tier)
            / Decimal(1_000_000)
        )


def service_tier_multiplier(service_tier: str, *, priority: Decimal, flex: Decimal) -> Decimal:
    """``priority`` or ``flex`` for those service tiers, else 1 (default, batch)."""
    if service_tier == "priority":
        return priority
    if service_tier == "flex":
        return flex
    return Decimal(1)
