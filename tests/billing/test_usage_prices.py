"""Each usage record carries its tier and the price in force when it happened;
invoices, spend and reports price it at that, never at the tenant's tier or the
price list of today."""

from __future__ import annotations

import uuid
from datetime import date
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Invoice, UsageRecord
from billing.selectors import month_spend, month_start, usage_daily
from billing.selectors.invoices import MissingPrice, invoice_lines_compute
from billing.services import invoice_issue
from tenants.services import tenant_set_tier
from tests.billing.conftest import MODEL
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db

MARCH = date(2025, 3, 1)


def exact(price, prompt: int, cached: int, completion: int) -> Decimal:
    """The cost rule, written out independently of Price.cost."""
    return (
        Decimal(prompt - cached) * price.prompt_per_million
        + Decimal(cached) * price.cached_prompt_per_million
        + Decimal(completion) * price.completion_per_million
    ) / Decimal(10**6)


def record_now(tenant, prompt: int, completion: int, *, status: str = "completed"):
    """A response settled now, through the service the request path calls."""
    return record_usage(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant_id=tenant.pk,
        model=MODEL,
        source="api",
        status=status,
        finish_reason="stop",
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=1,
    )[0]


def test_a_mid_month_tier_change_bills_each_part_at_its_own_tier(
    tenant_factory, price_factory, record_factory
):
    """Pro until the 15th, enterprise from the 16th: the invoice has a line at each
    tier's price for the days spent on it, not the whole month at enterprise."""
    tenant = tenant_factory(tier="pro")
    pro = price_factory("pro", date(2025, 1, 1), "2", "1", "8")
    enterprise = price_factory("enterprise", date(2025, 1, 1), "1", "0.5", "4")
    on_pro = [
        record_factory(tenant, date(2025, 3, 2), 100_000, 10_000, 50_000),
        record_factory(tenant, date(2025, 3, 15), 30_000, 0, 9_000),
    ]
    tenant_set_tier(tenant=tenant, tier_name="enterprise")
    on_enterprise = [record_factory(tenant, date(2025, 3, 20), 700_000, 0, 300_000)]

    invoice, _ = invoice_issue(tenant_id=tenant.pk, period=MARCH)

    first, second = invoice.lines.order_by("first_day")
    assert (first.price, first.first_day, first.last_day) == (
        pro,
        date(2025, 3, 2),
        date(2025, 3, 15),
    )
    assert (second.price, second.first_day) == (enterprise, date(2025, 3, 20))
    pro_cost = sum(
        exact(pro, r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in on_pro
    )
    ent_cost = sum(
        exact(enterprise, r.prompt_tokens, r.cached_tokens, r.completion_tokens)
        for r in on_enterprise
    )
    assert first.amount == pro_cost.quantize(Decimal("0.01"))
    assert second.amount == ent_cost.quantize(Decimal("0.01"))
    assert month_spend(tenant=tenant, period=MARCH) == pro_cost + ent_cost


def test_the_request_path_records_the_tier_and_price_it_was_served_at(
    tenant_factory, price_factory
):
    """Records written through the service carry the tier of the moment; this month's
    lines and spend follow them across a tier change."""
    tenant = tenant_factory(tier="pro")
    today = timezone.now().date()
    pro = price_factory("pro", date(2020, 1, 1), "1", "1", "10")
    enterprise = price_factory("enterprise", date(2020, 1, 1), "3", "3", "30")
    before = record_now(tenant, 1_000_000, 100_000)
    tenant_set_tier(tenant=tenant, tier_name="enterprise")
    after = record_now(tenant, 1_000_000, 100_000)
    assert (before.tier.name, before.price, after.tier.name, after.price) == (
        "pro",
        pro,
        "enterprise",
        enterprise,
    )
    lines = invoice_lines_compute(tenant=tenant, period=today)
    assert sorted((line.price.pk, line.cost) for line in lines) == sorted(
        [(pro.pk, Decimal("2")), (enterprise.pk, Decimal("6"))]
    )
    assert month_spend(tenant=tenant, period=month_start(today)) == Decimal("8")
    costs = usage_daily(tenant=tenant, start=today, end=today, group_by="model")
    assert [row["cost"] for row in costs] == [Decimal("8")]


def test_a_back_dated_price_does_not_reprice_recorded_usage(
    tenant_factory, price_factory, record_factory
):
    """A price added later with an earlier start applies to usage recorded from then
    on, not to records that already carry the price in force when they happened."""
    tenant = tenant_factory(tier="pro")
    original = price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    record_factory(tenant, date(2025, 3, 10), 1_000_000, 0, 0)
    price_factory("pro", date(2025, 3, 5), "9", "9", "9")  # back-dated afterwards

    (line,) = invoice_lines_compute(tenant=tenant, period=MARCH)
    assert (line.price, line.cost) == (original, Decimal("1"))


def test_usage_recorded_without_a_price_takes_the_one_added_for_its_day(
    tenant_factory, price_factory, record_factory
):
    """No price in force when it happened: the record carries none and cannot be
    invoiced until staff add one for its day, which it is then billed at."""
    tenant = tenant_factory(tier="pro")
    record = record_factory(tenant, date(2025, 3, 10), 1_000_000, 0, 0)
    assert record.price is None and record.tier.name == "pro"
    with pytest.raises(MissingPrice, match=MODEL):
        invoice_issue(tenant_id=tenant.pk, period=MARCH)
    assert not Invoice.objects.filter(tenant=tenant).exists()
    added = price_factory("pro", date(2025, 3, 1), "2", "2", "2")
    invoice, _ = invoice_issue(tenant_id=tenant.pk, period=MARCH)
    (line,) = invoice.lines.all()
    assert (line.price, invoice.total) == (added, Decimal("2.00"))
    assert UsageRecord.objects.get(pk=record.pk).price is None
