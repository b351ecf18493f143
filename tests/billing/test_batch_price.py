"""Batch usage (source ``batch``) is billed at BATCH_PRICE_MULTIPLIER of the price."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from billing.selectors import usage_daily
from billing.selectors.invoices import invoice_lines_compute
from tests.billing.conftest import MODEL
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db


def test_batch_usage_costs_the_multiplier_of_the_interactive_price(
    tenant_factory, price_factory, settings
):
    """Same tokens, one interactive and one batch response: the batch one
    costs half, in the usage page's rows and in the month's invoice; the
    multiplier is the one in force when the record was written."""
    settings.BATCH_PRICE_MULTIPLIER = Decimal("0.5")
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2026, 1, 1), prompt="2", cached="1", completion="4")
    day = datetime(2026, 3, 3, 12, tzinfo=UTC)
    tokens = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}
    interactive, _ = record_usage(tenant_id=tenant.pk, model=MODEL, created_at=day, **tokens)
    batch, _ = record_usage(
        tenant_id=tenant.pk, model=MODEL, created_at=day, source="batch", **tokens
    )
    assert (interactive.price_multiplier, batch.price_multiplier) == (1, Decimal("0.5"))
    settings.BATCH_PRICE_MULTIPLIER = Decimal("0.1")
    rows = usage_daily(tenant=tenant, start=day.date(), end=day.date(), group_by="model")
    # 6 for the interactive response, 3 for the batch one: rows of their own.
    costs = {row["group"]: row["cost"] for row in rows}
    assert costs == {MODEL: Decimal(6), f"{MODEL} (batch)": Decimal(3)}
    lines = invoice_lines_compute(tenant=tenant, period=date(2026, 3, 1))
    assert [(line.price_multiplier, line.cost, line.requests) for line in lines] == [
        (Decimal(1), Decimal(6), 1),
        (Decimal("0.5"), Decimal(3), 1),
    ]


def test_an_issued_invoice_has_a_batch_line_that_reproduces(
    tenant_factory, price_factory, settings
):
    from billing.selectors.invoices import invoice_differences
    from billing.services import invoice_issue

    settings.BATCH_PRICE_MULTIPLIER = Decimal("0.5")
    tenant = tenant_factory(tier="pro")
    price_factory("pro", date(2026, 1, 1), prompt="2", cached="1", completion="4")
    day = datetime(2026, 3, 3, 12, tzinfo=UTC)
    tokens = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}
    record_usage(tenant_id=tenant.pk, model=MODEL, created_at=day, **tokens)
    record_usage(tenant_id=tenant.pk, model=MODEL, created_at=day, source="batch", **tokens)
    invoice, created = invoice_issue(tenant_id=tenant.pk, period=date(2026, 3, 1))
    assert created
    amounts = sorted((line.price_multiplier, line.amount) for line in invoice.lines.all())
    assert amounts == [(Decimal("0.5"), Decimal("3.00")), (Decimal(1), Decimal("6.00"))]
    assert invoice_differences(invoice=invoice) == []
