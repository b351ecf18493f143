"""Prices in force: which Price applies to a model, tier and day."""

from __future__ import annotations

import bisect
from datetime import date
from decimal import Decimal

from billing.models import Price, UsageRecord

# Failed responses are the platform's fault (engine error, worker lost):
# they are recorded and reported, never billed. Cancelled and length-cut
# responses did consume what the client asked for and are billed.
BILLABLE_STATUSES = (
    UsageRecord.Status.COMPLETED,
    UsageRecord.Status.INCOMPLETE,
    UsageRecord.Status.CANCELLED,
)


class PriceBook:
    """The price history of one tier, loaded once, looked up per (model, day)."""

    def __init__(self, prices: list[Price]):
        self._by_model: dict[str, tuple[list[date], list[Price]]] = {}
        for price in sorted(prices, key=lambda p: (p.model, p.effective_from)):
            days, rows = self._by_model.setdefault(price.model, ([], []))
            days.append(price.effective_from)
            rows.append(price)

    @classmethod
    def for_tier(cls, tier_id: int, *, models: list[str] | None = None) -> PriceBook:
        prices = Price.objects.filter(tier_id=tier_id)
        if models is not None:
            prices = prices.filter(model__in=models)
        return cls(list(prices))

    def price(self, model: str, day: date) -> Price | None:
        """The price with the latest ``effective_from`` on or before ``day``."""
        entry = self._by_model.get(model)
        if entry is None:
            return None
        days, rows = entry
        index = bisect.bisect_right(days, day) - 1
        return rows[index] if index >= 0 else None

    def cost(
        self,
        model: str,
        day: date,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
    ) -> Decimal:
        """Exact cost at the price in force; zero when the model has no price yet."""
        price = self.price(model, day)
        if price is None:
            return Decimal(0)
        return price.cost(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
        )
