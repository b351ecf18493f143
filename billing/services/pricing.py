"""Writes for prices."""

from datetime import date
from decimal import Decimal

from billing.models import Price
from tenants.models import Tier


def price_set(
    *,
    model: str,
    tier: Tier,
    effective_from: date,
    prompt_per_million: Decimal,
    cached_prompt_per_million: Decimal,
    completion_per_million: Decimal,
) -> tuple[Price, bool]:
    """The price of ``model`` on ``tier`` from ``effective_from``; (price, created).

    A price already set for that day is kept as it is: a price change is a
    row with a later date, never an edit of history that invoices were
    computed from.
    """
    price, created = Price.objects.get_or_create(
        model=model,
        tier=tier,
        effective_from=effective_from,
        defaults={
            "prompt_per_million": prompt_per_million,
            "cached_prompt_per_million": cached_prompt_per_million,
            "completion_per_million": completion_per_million,
        },
    )
    if created:
        price.full_clean()
    return price, created
