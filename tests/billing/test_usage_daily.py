"""usage_daily: the console's per-day usage, priced at the price in force."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest

from billing.models import DailyUsage
from billing.selectors import PriceBook, usage_daily
from billing.services import daily_usage_rollup
from tests.billing.conftest import MODEL

pytestmark = pytest.mark.django_db


def test_the_price_in_force_is_the_latest_on_or_before_the_day(price_factory, tiers):
    first = price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    second = price_factory("pro", date(2025, 2, 1), "2", "2", "2")
    book = PriceBook.for_tier(tiers["pro"].pk)
    assert book.price(MODEL, date(2024, 12, 31)) is None
    assert book.price(MODEL, date(2025, 1, 31)) == first
    assert book.price(MODEL, date(2025, 2, 1)) == second
    assert book.price("other-model", date(2025, 2, 1)) is None


def test_usage_daily_by_model_and_by_key(
    tenant_factory, api_key_factory, price_factory, record_factory
):
    """Per day and group: all tokens counted, cached prompt tokens at the cached price,
    failed responses free, the tier's own price, a new price from its day on."""
    tenant = tenant_factory(tier="pro")
    key, _ = api_key_factory(tenant=tenant, name="prod")
    price_factory("pro", date(2025, 1, 1), "1.5", "0.5", "6")
    price_factory("pro", date(2025, 3, 2), "1", "0.25", "4")
    price_factory("enterprise", date(2025, 1, 1), "100", "100", "100")
    record_factory(tenant, date(2025, 3, 1), 3_000_000, 1_000_000, 500_000, api_key=key)
    record_factory(tenant, date(2025, 3, 1), 1_000_000, 0, 0, status="failed", api_key=key)
    record_factory(tenant, date(2025, 3, 1), 2_000_000, 0, 0, source="console")
    record_factory(tenant, date(2025, 3, 2), 1_000_000, 1_000_000, 1_000_000, api_key=key)
    record_factory(tenant_factory(tier="pro"), date(2025, 3, 1), 10**9, 0, 10**9)

    by_model = usage_daily(
        tenant=tenant, start=date(2025, 3, 1), end=date(2025, 3, 2), group_by="model"
    )
    assert [(r["day"], r["group"], r["prompt_tokens"], r["cost"]) for r in by_model] == [
        # 2M uncached x 1.5 + 1M cached x 0.5 + 0.5M x 6, plus the console's 2M x 1.5
        (date(2025, 3, 1), MODEL, 6_000_000, Decimal("6.5") + Decimal("3")),
        (date(2025, 3, 2), MODEL, 1_000_000, Decimal("0.25") + Decimal("4")),
    ]
    by_key = usage_daily(
        tenant=tenant, start=date(2025, 3, 1), end=date(2025, 3, 1), group_by="api_key"
    )
    assert {r["group"]: (r["requests"], r["cost"]) for r in by_key} == {
        "Console": (1, Decimal("3")),
        str(key): (2, Decimal("6.5")),
    }
    with pytest.raises(ValueError, match="group_by"):
        usage_daily(tenant=tenant, start=date(2025, 3, 1), end=date(2025, 3, 1), group_by="user")


def test_the_daily_rollup_is_rebuilt_not_added_to(tenant_factory, price_factory, record_factory):
    """Rerunning the roll-up for a day gives the same rows, with new records included."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    record_factory(tenant, date(2025, 3, 1), 500_000, 0, 500_000)
    assert daily_usage_rollup(day=date(2025, 3, 1)) == 1
    assert daily_usage_rollup(day=date(2025, 3, 1)) == 1
    record_factory(tenant, date(2025, 3, 1), 1_000_000, 0, 0)
    daily_usage_rollup(day=date(2025, 3, 1))
    (row,) = DailyUsage.objects.filter(tenant=tenant)
    assert (row.requests, row.prompt_tokens, row.cost) == (2, 1_500_000, Decimal(2))
