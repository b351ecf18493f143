"""Service tiers on the usage record: priority costs more, flex less.

A response's record carries the service tier it was served at
(``UsageRecord.service_tier``, from its usage tag); every price of it
(spend, reports, invoices, the budget hold) is the price in force times
that tier's multiplier on the price row.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Price
from billing.selectors import month_spend, usage_daily
from billing.selectors.invoices import invoice_lines_compute
from billing.services.budgets import Rates
from tests.billing.conftest import MODEL
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db


def record(tenant, tier: str, prompt: int, completion: int):
    return record_usage(
        tenant_id=tenant.pk,
        model=MODEL,
        source="api",
        prompt_tokens=prompt,
        completion_tokens=completion,
        service_tier=tier,
    )[0]


def test_a_new_price_has_the_default_multipliers(price_factory):
    price = price_factory("pro", date(2025, 1, 1), "1", "0.5", "4")
    price.refresh_from_db()
    assert (price.priority_multiplier, price.flex_multiplier) == (Decimal(2), Decimal("0.5"))
    assert [price.multiplier(t) for t in ("priority", "default", "flex", "batch")] == [
        Decimal(2),
        Decimal(1),
        Decimal("0.5"),
        Decimal(1),
    ]


def test_each_record_is_billed_at_its_service_tiers_multiplier(tenant_factory, price_factory):
    tenant = tenant_factory(tier="pro")
    today = timezone.now().date()
    price = price_factory("pro", date(2025, 1, 1), "2", "1", "8")
    Price.objects.filter(pk=price.pk).update(priority_multiplier=Decimal("3"))
    base = (Decimal(1000) * 2 + Decimal(500) * 8) / Decimal(10**6)
    records = [record(tenant, t, 1000, 500) for t in ("priority", "default", "flex")]
    assert [r.service_tier for r in records] == ["priority", "default", "flex"]
    assert {r.price_id for r in records} == {price.pk}
    # 3 (this row's priority multiplier) + 1 + 0.5 (the default flex one).
    expected = base * Decimal("4.5")
    assert month_spend(tenant=tenant, period=today) == expected
    (row,) = usage_daily(tenant=tenant, start=today, end=today, group_by="model")
    assert row["cost"] == expected and row["requests"] == 3
    lines = invoice_lines_compute(tenant=tenant, period=today)
    assert sum(line.cost for line in lines) == expected


def test_the_budget_hold_prices_the_service_tier_too(price_factory):
    price = price_factory("pro", date(2025, 1, 1), "2", "1", "8")
    tokens = {"prompt_tokens": 1000, "cached_tokens": 0, "completion_tokens": 500}
    default = Rates.of(price).cost(**tokens)
    assert Rates.of(price, service_tier="priority").cost(**tokens) == default * 2
    assert Rates.of(price, service_tier="flex").cost(**tokens) == default / 2
    # The ledger remembers the price alone; the tier is the request's.
    remembered = Rates.of(price, service_tier="flex").encode()
    assert Rates.decode(remembered, service_tier="priority").cost(**tokens) == default * 2
    # Remembered before the multipliers: each is 1.
    old = f"{price.pk}|2|1|8"
    assert Rates.decode(old, service_tier="priority").cost(**tokens) == default


def test_records_written_before_service_tiers_bill_as_default(
    tenant_factory, price_factory, record_factory
):
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "2", "1", "8")
    day = date(2025, 3, 3)
    old = record_factory(tenant, day, 1000, 0, 500)
    assert old.service_tier == "default"
    assert month_spend(tenant=tenant, period=day) == (
        Decimal(1000) * 2 + Decimal(500) * 8
    ) / Decimal(10**6)
