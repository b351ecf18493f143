"""Backfills: 0005 (the tier and price of old records), 0009 (records of
invoiced months marked billed by their invoice)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("billing", "0003_billing_prices_invoices_budgets_gpu")]
AFTER = [("billing", "0005_usage_tier_price_backfill")]


def migrate(billing):
    """Every app at its latest migration, billing at ``billing``; the state's apps."""
    executor = MigrationExecutor(connection)
    leaves = executor.loader.graph.leaf_nodes()
    targets = [node for node in leaves if node[0] != "billing"] + billing
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture
def latest_after():
    """Every app back at its latest migration after the test (the next tests' schema)."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("latest_after")
def test_existing_records_get_their_tenants_tier_and_the_price_in_force_on_their_day(tiers):
    """Each old record: the tenant's tier, and that tier's price on the record's UTC
    day (the latest from on or before it); none in force leaves the price empty."""
    apps = migrate(BEFORE)
    try:
        Tenant, Price = apps.get_model("tenants", "Tenant"), apps.get_model("billing", "Price")
        Record = apps.get_model("billing", "UsageRecord")
        tenant = Tenant.objects.create(name="Old", slug="old", tier_id=tiers["pro"].pk)
        price = dict(prompt_per_million=1, cached_prompt_per_million=1, completion_per_million=1)
        january = Price.objects.create(
            model="m", tier_id=tiers["pro"].pk, effective_from=date(2025, 1, 1), **price
        )
        march = Price.objects.create(
            model="m", tier_id=tiers["pro"].pk, effective_from=date(2025, 3, 1), **price
        )
        Price.objects.create(
            model="m", tier_id=tiers["enterprise"].pk, effective_from=date(2024, 1, 1), **price
        )

        def record(rid: str, at: datetime, model: str = "m") -> None:
            Record.objects.create(
                response_id=rid,
                tenant=tenant,
                model=model,
                source="api",
                status="completed",
                prompt_tokens=1,
                completion_tokens=1,
                created_at=at,
            )

        record("feb", datetime(2025, 2, 28, 23, 59, 59, tzinfo=UTC))
        record("mar", datetime(2025, 3, 1, 0, 0, tzinfo=UTC))
        record("dec", datetime(2024, 12, 31, 12, tzinfo=UTC))
        record("unpriced", datetime(2025, 3, 2, tzinfo=UTC), model="other")
    finally:
        apps = migrate(AFTER)

    Record = apps.get_model("billing", "UsageRecord")
    rows = {r.response_id: r for r in Record.objects.filter(tenant_id=tenant.pk)}
    assert {r.tier_id for r in rows.values()} == {tiers["pro"].pk}
    assert rows["feb"].price_id == january.pk
    assert rows["mar"].price_id == march.pk
    assert rows["dec"].price_id is None
    assert rows["unpriced"].price_id is None
    assert rows["mar"].price.prompt_per_million == Decimal(1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("latest_after")
def test_records_of_invoiced_months_are_marked_billed_by_their_invoice(tiers):
    """Records of a month with an issued invoice get that invoice; records
    of other months, or of another tenant, stay unbilled."""
    apps = migrate([("billing", "0007_usage_dead_letter_error")])
    try:
        Tenant = apps.get_model("tenants", "Tenant")
        Invoice, Record = (
            apps.get_model("billing", "Invoice"),
            apps.get_model("billing", "UsageRecord"),
        )
        tenant = Tenant.objects.create(name="Inv", slug="inv", tier_id=tiers["pro"].pk)
        other = Tenant.objects.create(name="Oth", slug="oth", tier_id=tiers["pro"].pk)
        february = Invoice.objects.create(
            tenant=tenant, period=date(2025, 2, 1), number="INV-1", currency="USD", total=0
        )

        def record(rid: str, at: datetime, owner=tenant) -> None:
            Record.objects.create(
                response_id=rid,
                tenant=owner,
                model="m",
                source="api",
                status="completed",
                prompt_tokens=1,
                completion_tokens=1,
                created_at=at,
            )

        record("feb-first", datetime(2025, 2, 1, 0, 0, tzinfo=UTC))
        record("feb-last", datetime(2025, 2, 28, 23, 59, 59, tzinfo=UTC))
        record("mar", datetime(2025, 3, 1, 0, 0, tzinfo=UTC))
        record("jan", datetime(2025, 1, 31, 23, 59, 59, tzinfo=UTC))
        record("other-feb", datetime(2025, 2, 10, tzinfo=UTC), owner=other)
    finally:
        apps = migrate([("billing", "0009_usage_invoice_backfill")])

    Record = apps.get_model("billing", "UsageRecord")
    billed = dict(Record.objects.values_list("response_id", "invoice_id"))
    assert billed == {
        "feb-first": february.pk,
        "feb-last": february.pk,
        "mar": None,
        "jan": None,
        "other-feb": None,
    }
