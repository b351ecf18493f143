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
    (row,) = usage_daily(tenant=tenant, start=day.date(), end=day.date(), group_by="model")
    # 6 for the interactive response, 3 for the batch one.
    assert row["cost"] == Decimal(9)
    (line,) = invoice_lines_compute(tenant=tenant, period=date(2026, 3, 1))
    assert line.cost == Decimal(9) and line.requests == 2
