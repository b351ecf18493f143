"""Usage settled after its month's invoice lands on the next invoice, as an adjustment."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from billing.models import Invoice, UsageRecord
from billing.models.invoices import to_cents
from billing.selectors.invoices import invoice_differences
from billing.services import invoice_issue, tenants_to_invoice, usage_settle_pending
from tests.billing.conftest import MODEL
from wire.usage import MemoryUsageStream, UsageEntry

pytestmark = pytest.mark.django_db

FEBRUARY, MARCH, APRIL = date(2025, 2, 1), date(2025, 3, 1), date(2025, 4, 1)
# The last second of February (UTC): a request enqueued then is February's.
FEB_LAST_SECOND = datetime(2025, 3, 1, tzinfo=UTC) - timedelta(seconds=1)


def settle_late(tenant_id: int, created_at: datetime, prompt: int, completion: int) -> str:
    """A worker's usage entry, delivered and settled now, for a request of ``created_at``."""
    stream = MemoryUsageStream()
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    stream.append(
        [
            UsageEntry(
                response_id=response_id,
                tenant_id=tenant_id,
                model=MODEL,
                status="completed",
                finish_reason="stop",
                prompt_tokens=prompt,
                cached_tokens=0,
                completion_tokens=completion,
                queue_time_ms=0,
                ttft_ms=5,
                duration_ms=9,
                created_at=created_at.timestamp(),
                finished_at=created_at.timestamp() + 1,
            )
        ]
    )
    assert usage_settle_pending(consumer="late", stream=stream).recorded == 1
    return response_id


def test_usage_settled_after_its_months_invoice_is_billed_on_the_next(
    tenant_factory, price_factory, record_factory
):
    """A February request whose usage settles after February's invoice was
    issued is billed once, on March's invoice, as an adjustment line at
    February's price; February's invoice is unchanged."""
    tenant = tenant_factory(tier="pro")
    feb_price = price_factory("pro", date(2025, 1, 1), "1", "1", "2")
    mar_price = price_factory("pro", MARCH, "3", "3", "6")
    record_factory(tenant, date(2025, 2, 10), 1_000_000, 0, 0)
    february, created = invoice_issue(tenant_id=tenant.pk, period=FEBRUARY)
    assert created and february.total == to_cents(feb_price.prompt_per_million)

    late_id = settle_late(tenant.pk, FEB_LAST_SECOND, 2_000_000, 500_000)
    record_factory(tenant, date(2025, 3, 1), 1_000_000, 0, 0)

    # Nothing changes on February's invoice, and March's is due.
    february.refresh_from_db()
    assert february.total == 1 and invoice_differences(invoice=february) == []
    assert tenant.pk in tenants_to_invoice(period=MARCH)
    march, _ = invoice_issue(tenant_id=tenant.pk, period=MARCH)

    regular, adjustment = march.lines.all()
    assert (regular.adjustment, regular.price, regular.first_day) == (False, mar_price, MARCH)
    assert regular.amount == 3
    assert adjustment.adjustment and adjustment.price == feb_price
    assert (adjustment.first_day, adjustment.last_day) == (date(2025, 2, 28),) * 2
    assert (adjustment.requests, adjustment.prompt_tokens) == (1, 2_000_000)
    assert adjustment.amount == 2 * 1 + 0.5 * 2
    assert march.total == regular.amount + adjustment.amount
    assert UsageRecord.objects.get(response_id=late_id).invoice == march
    assert invoice_differences(invoice=march) == []

    # Billed once: April's invoice, if any, does not bill it again.
    assert tenant.pk not in tenants_to_invoice(period=APRIL)


def test_late_usage_alone_makes_the_next_invoice_due(tenant_factory, price_factory, record_factory):
    """A tenant with no March usage but a late February record still gets a
    March invoice, holding only the adjustment."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    record_factory(tenant, date(2025, 2, 3), 10, 0, 10)
    invoice_issue(tenant_id=tenant.pk, period=FEBRUARY)
    assert tenant.pk not in tenants_to_invoice(period=MARCH)

    settle_late(tenant.pk, FEB_LAST_SECOND, 1_000_000, 0)

    assert tenant.pk in tenants_to_invoice(period=MARCH)
    march, _ = invoice_issue(tenant_id=tenant.pk, period=MARCH)
    (line,) = march.lines.all()
    assert line.adjustment and march.total == line.amount == 1


def test_a_month_not_yet_invoiced_keeps_its_own_usage(
    tenant_factory, price_factory, record_factory
):
    """February's records are no adjustment on March's invoice while
    February has no invoice yet: February's invoice bills them itself."""
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2025, 1, 1), "1", "1", "1")
    record_factory(tenant, date(2025, 2, 3), 1_000_000, 0, 0)
    record_factory(tenant, date(2025, 3, 3), 2_000_000, 0, 0)

    march, _ = invoice_issue(tenant_id=tenant.pk, period=MARCH)
    (line,) = march.lines.all()
    assert not line.adjustment and march.total == 2
    february, _ = invoice_issue(tenant_id=tenant.pk, period=FEBRUARY)
    assert february.total == 1
    assert set(Invoice.objects.filter(tenant=tenant).values_list("total", flat=True)) == {1, 2}
