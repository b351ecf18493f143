"""Prices per model and tier, with the date from which each applies."""

from decimal import Decimal

from django.core.validators import MinValueValidator
from django.db import models

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
    """

    model = models.CharField(max_length=128, help_text="Served model name.")
    tier = models.ForeignKey("tenants.Tier", on_delete=models.PROTECT, related_name="prices")
    effective_from = models.DateField(help_text="First day (UTC) this price applies.")
    prompt_per_million = models.DecimalField(**UNIT_PRICE)
    cached_prompt_per_million = models.DecimalField(**UNIT_PRICE)
    completion_per_million = models.DecimalField(**UNIT_PRICE)
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

    def cost(self, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Decimal:
        """The exact (unrounded) cost of these token counts at this price."""
        return (
            (prompt_tokens - cached_tokens) * self.prompt_per_million
            + cached_tokens * self.cached_prompt_per_million
            + completion_tokens * self.completion_per_million
        ) / Decimal(1_000_000)
