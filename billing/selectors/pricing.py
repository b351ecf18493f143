"""Prices in force: which Price applies to a model, tier and day.

A UsageRecord carries its tier and the price in force when it happened
(``UsageRecord.tier``, ``.price``); ``Pricer`` prices usage by those, and
looks the tier's price up for the day only where a record has none (none
was in force then; one added since applies).
"""

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
        service_tier: str = "default",
    ) -> Decimal:
        """Exact cost at the price in force; zero when the model has no price yet."""
        price = self.price(model, day)
        if price is None:
            return Decimal(0)
        return price.cost(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
            service_tier=service_tier,
        )


def price_in_force(*, tier_id: int, model: str, day: date) -> Price | None:
    """The price of ``model`` on ``tier_id`` on ``day`` (one query)."""
    return (
        Price.objects.filter(tier_id=tier_id, model=model, effective_from__lte=day)
        .order_by("-effective_from")
        .first()
    )


class Pricer:
    """Prices usage groups at the price each record carries (loaded once per id)."""

    def __init__(self) -> None:
        self._prices: dict[int, Price] = {}
        self._books: dict[int, PriceBook] = {}

    def price(self, *, price_id: int | None, tier_id: int, model: str, day: date) -> Price | None:
        if price_id is not None:
            price = self._prices.get(price_id)
            if price is None:
                price = self._prices[price_id] = Price.objects.get(pk=price_id)
            return price
        book = self._books.get(tier_id)
        if book is None:
            book = self._books[tier_id] = PriceBook.for_tier(tier_id)
        return book.price(model, day)

    def cost(self, group) -> Decimal:
        """Exact cost of a ``UsageGroup``; zero when no price applies."""
        price = self.price(
            price_id=group.price_id, tier_id=group.tier_id, model=group.model, day=group.day
        )
        if price is None:
            return Decimal(0)
        return group.price_multiplier * price.cost(
            prompt_tokens=group.prompt_tokens,
            cached_tokens=group.cached_tokens,
            completion_tokens=group.completion_tokens,
            service_tier=group.service_tier,
        )
