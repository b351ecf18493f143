"""Monthly invoices issued by a real Celery worker, from the UsageRecords."""

from __future__ import annotations

import threading
import time
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_UP, Decimal

import pytest
from celery.exceptions import TaskError
from django.db import connections

from billing import tasks
from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.selectors.invoices import invoice_differences
from billing.services import invoice_issue
from tests.billing.conftest import MODEL

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("celery_worker")]

MARCH = date(2025, 3, 1)
TIMEOUT = 60


def exact_cost(record: UsageRecord, price) -> Decimal:
    """The cost rule, written out independently of Price.cost."""
    uncached = record.prompt_tokens - record.cached_tokens
    return (
        Decimal(uncached) * price.prompt_per_million
        + Decimal(record.cached_tokens) * price.cached_prompt_per_million
        + Decimal(record.completion_tokens) * price.completion_per_million
    ) / Decimal(10**6)


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def test_invoice_total_is_the_records_at_the_price_in_force(
    tenant_factory, price_factory, record_factory
):
    """Billable March records of this tenant, at its tier's price, to the cent;
    failed responses, other months, other tenants and other tiers' prices are out."""
    tenant, other = tenant_factory(tier="pro"), tenant_factory(tier="pro")
    price = price_factory("pro", date(2025, 1, 1), "0.1500000001", "0.075", "0.6000000003")
    price_factory("enterprise", date(2025, 1, 1), "99", "99", "99")
    billed = [
        record_factory(tenant, date(2025, 3, 1), 1234, 200, 567),
        record_factory(tenant, date(2025, 3, 9), 98_765, 50_000, 4_321),
        record_factory(tenant, date(2025, 3, 31), 7, 0, 3_333_333),
        record_factory(tenant, date(2025, 3, 20), 555, 0, 77, status="cancelled"),
        record_factory(tenant, date(2025, 3, 21), 900, 100, 0, status="incomplete"),
    ]
    record_factory(tenant, date(2025, 3, 10), 10**6, 0, 10**6, status="failed")
    record_factory(tenant, date(2025, 4, 1), 10**6, 0, 10**6)
    record_factory(other, date(2025, 3, 10), 10**6, 0, 10**6)

    result = tasks.invoice_issue.delay(tenant.pk, MARCH.isoformat()).get(timeout=TIMEOUT)

    invoice = Invoice.objects.get(tenant=tenant, period=MARCH)
    expected = sum(exact_cost(r, price) for r in billed)
    assert invoice.total == cents(expected)
    assert result == {"number": invoice.number, "total": str(invoice.total), "created": True}
    (line,) = invoice.lines.all()
    assert (line.requests, line.prompt_tokens, line.completion_tokens) == (
        5,
        sum(r.prompt_tokens for r in billed),
        sum(r.completion_tokens for r in billed),
    )
    assert (line.first_day, line.last_day) == (date(2025, 3, 1), date(2025, 3, 31))
    assert line.amount == invoice.total


def test_a_mid_month_price_change_splits_the_line(tenant_factory, price_factory, record_factory):
    """A new price from the 16th: one line per price, each at its own price, split at
    midnight UTC."""
    tenant = tenant_factory(tier="pro")
    old = price_factory("pro", date(2025, 2, 1), "1.00", "0.50", "2.00")
    new = price_factory("pro", date(2025, 3, 16), "0.80", "0.20", "1.60")
    before = [
        record_factory(tenant, date(2025, 3, 2), 10_000, 4_000, 20_000),
        record_factory(
            tenant, None, 333, 0, 1_111, created_at=datetime(2025, 3, 15, 23, 59, 59, tzinfo=UTC)
        ),
    ]
    after = [
        record_factory(
            tenant, None, 777, 77, 7_777, created_at=datetime(2025, 3, 16, 0, 0, tzinfo=UTC)
        ),
        record_factory(tenant, date(2025, 3, 30), 50_001, 1, 12_345),
    ]

    tasks.invoice_issue.delay(tenant.pk, MARCH.isoformat()).get(timeout=TIMEOUT)

    invoice = Invoice.objects.get(tenant=tenant, period=MARCH)
    first, second = invoice.lines.order_by("first_day")
    assert (first.price, first.first_day, first.last_day) == (
        old,
        date(2025, 3, 2),
        date(2025, 3, 15),
    )
    assert (second.price, second.first_day, second.last_day) == (
        new,
        date(2025, 3, 16),
        date(2025, 3, 30),
    )
    assert first.amount == cents(sum(exact_cost(r, old) for r in before))
    assert second.amount == cents(sum(exact_cost(r, new) for r in after))
    assert first.completion_per_million == Decimal("2.00")
    assert invoice.total == first.amount + second.amount
    # Reproducible: recomputed from the records, the lines come out the same,
    # a record settled late is the next invoice's (test_invoice_adjustments)...
    assert invoice_differences(invoice=invoice) == []
    record_factory(tenant, date(2025, 3, 3), 10_000, 0, 0)
    assert invoice_differences(invoice=invoice) == []
    # ...until a record it billed changes.
    UsageRecord.objects.filter(pk=before[0].pk).update(prompt_tokens=10_001)
    (difference,) = invoice_differences(invoice=invoice)
    assert difference.startswith(f"{MODEL} at price {old.pk}: issued (2, ")


def test_rerun_and_concurrent_runs_bill_once(tenant_factory, price_factory, record_factory):
    """Four concurrent invoice tasks, then the monthly job twice: one invoice, one
    set of lines, exactly one run reports having created it."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "3", "1", "9")
    for day in range(1, 29, 3):
        record_factory(tenant, date(2025, 3, day), 1000 + day, day, 500 * day)

    results = [tasks.invoice_issue.delay(tenant.pk, MARCH.isoformat()) for _ in range(4)]
    outcomes = [r.get(timeout=TIMEOUT) for r in results]
    for _ in range(2):
        queued = tasks.invoices_issue_monthly.delay(MARCH.isoformat()).get(timeout=TIMEOUT)
        assert tenant.pk not in queued  # already invoiced: nothing to enqueue
    again = tasks.invoice_issue.delay(tenant.pk, MARCH.isoformat()).get(timeout=TIMEOUT)

    assert Invoice.objects.filter(tenant=tenant).count() == 1
    invoice = Invoice.objects.get(tenant=tenant)
    assert InvoiceLine.objects.filter(invoice=invoice).count() == 1
    assert sorted(o["created"] for o in outcomes) == [False, False, False, True]
    assert {o["number"] for o in [*outcomes, again]} == {invoice.number}
    assert again["created"] is False


def test_the_monthly_job_enqueues_each_tenant_with_usage(
    tenant_factory, price_factory, record_factory
):
    """invoices_issue_monthly finds March's tenants and the worker issues each invoice."""
    price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    with_usage = [tenant_factory(tier="pro") for _ in range(2)]
    idle = tenant_factory(tier="pro")
    for tenant in with_usage:
        record_factory(tenant, date(2025, 3, 5), 10, 0, 10)

    queued = tasks.invoices_issue_monthly.delay(MARCH.isoformat()).get(timeout=TIMEOUT)

    assert set(queued) >= {t.pk for t in with_usage} and idle.pk not in queued
    deadline = datetime.now(UTC).timestamp() + TIMEOUT
    while Invoice.objects.filter(tenant__in=with_usage).count() < 2:
        assert datetime.now(UTC).timestamp() < deadline, "invoices never issued"
        time.sleep(0.2)
    assert not Invoice.objects.filter(tenant=idle).exists()


def test_usage_without_a_price_is_not_invoiced(tenant_factory, record_factory):
    """No price in force: the task fails with the model and day named, nothing is issued."""
    tenant = tenant_factory(tier="pro")
    record_factory(tenant, date(2025, 3, 5), 10, 0, 10, model="unpriced-model")
    with pytest.raises(Exception, match="unpriced-model") as caught:
        tasks.invoice_issue.delay(tenant.pk, MARCH.isoformat()).get(timeout=TIMEOUT)
    assert not isinstance(caught.value, TaskError | TimeoutError)
    assert not Invoice.objects.filter(tenant=tenant).exists()


def test_two_issuers_racing_in_threads_bill_once(tenant_factory, price_factory, record_factory):
    """Two database connections issue the same invoice at the same instant: one creates
    it, the other waits on the tenant lock and returns it."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "5", "1", "15")
    record_factory(tenant, date(2025, 3, 3), 123_456, 23_456, 7_890)
    barrier = threading.Barrier(2)
    outcomes: list[tuple[str, bool]] = []

    def issue() -> None:
        try:
            barrier.wait(10)
            invoice, created = invoice_issue(tenant_id=tenant.pk, period=MARCH)
            outcomes.append((invoice.number, created))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(created for _, created in outcomes) == [False, True]
    assert len({number for number, _ in outcomes}) == 1
    assert InvoiceLine.objects.filter(invoice__tenant=tenant).count() == 1
