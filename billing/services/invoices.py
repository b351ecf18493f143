"""Issuing monthly invoices: once per tenant and month, from the UsageRecords."""

from __future__ import annotations

from datetime import UTC, date
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import DateField, DateTimeField, Exists, OuterRef
from django.db.models.functions import Cast, TruncMonth
from django.utils import timezone

from billing.models import Invoice, InvoiceLine, UsageRecord
from billing.models.invoices import to_cents
from billing.selectors.budgets import month_end, month_start
from billing.selectors.invoices import invoice_lines_billed
from billing.selectors.usage import day_bounds
from tenants.models import Tenant


def invoice_number(*, tenant_id: int, period: date) -> str:
    return f"INV-{period:%Y%m}-{tenant_id:06d}"


def invoice_issue(*, tenant_id: int, period: date) -> tuple[Invoice, bool]:
    """Issue the tenant's invoice for the month of ``period``; ``(invoice, created)``.

    It bills the month's records, and as adjustment lines the records of
    earlier months that were settled after their month's invoice was
    issued (a usage entry delivered late); each record it bills is marked
    with it, so none is billed twice or never. Idempotent: a rerun, or a
    concurrent run in another worker, returns the invoice the first one
    issued (created=False). The month must be over. Raises MissingPrice
    (nothing issued) when billable usage has no price.
    """
    period = month_start(period)
    if period >= month_start(timezone.now().date()):
        raise ValueError(f"{period:%Y-%m} is not over yet: invoices bill closed months")
    try:
        with transaction.atomic():
            # NO KEY UPDATE: serializes issuers of this tenant without
            # blocking UsageRecord inserts (their foreign key takes KEY SHARE).
            tenant = (
                Tenant.objects.select_for_update(no_key=True)
                .select_related("tier")
                .get(pk=tenant_id)
            )
            existing = Invoice.objects.filter(tenant=tenant, period=period).first()
            if existing is not None:
                return existing, False
            invoice = Invoice.objects.create(
                tenant=tenant,
                period=period,
                number=invoice_number(tenant_id=tenant.pk, period=period),
                currency=settings.BILLING_CURRENCY,
                total=to_cents(Decimal(0)),
            )
            # Mark first, then sum what was marked: a record committed in
            # between is either marked (and on the lines) or left for the
            # next invoice, never counted without being marked.
            since, until = day_bounds(period, month_end(period))
            unbilled = UsageRecord.objects.filter(tenant=tenant, invoice__isnull=True)
            unbilled.filter(created_at__gte=since, created_at__lt=until).update(invoice=invoice)
            unbilled.filter(created_at__lt=since).filter(_month_invoiced()).update(invoice=invoice)
            drafts = invoice_lines_billed(invoice=invoice)
            amounts = [to_cents(draft.cost) for draft in drafts]
            invoice.total = sum(amounts, start=to_cents(Decimal(0)))
            invoice.save(update_fields=["total"])
            InvoiceLine.objects.bulk_create(
                InvoiceLine(
                    invoice=invoice,
                    model=draft.model,
                    price=draft.price,
                    first_day=draft.first_day,
                    last_day=draft.last_day,
                    requests=draft.requests,
                    prompt_tokens=draft.prompt_tokens,
                    cached_tokens=draft.cached_tokens,
                    completion_tokens=draft.completion_tokens,
                    prompt_per_million=draft.price.prompt_per_million,
                    cached_prompt_per_million=draft.price.cached_prompt_per_million,
                    completion_per_million=draft.price.completion_per_million,
                    price_multiplier=draft.price_multiplier,
                    amount=amount,
                    adjustment=draft.adjustment,
                )
                for draft, amount in zip(drafts, amounts, strict=True)
            )
            return invoice, True
    except IntegrityError:
        # Only a writer bypassing the lock (SQLite has no row locks) gets here.
        return Invoice.objects.get(tenant_id=tenant_id, period=period), False


def _month_invoiced() -> Exists:
    """True for a record whose month's invoice has been issued."""
    # Cast: a truncation needs its argument's type, which an OuterRef does
    # not have until the outer query resolves it.
    created_at = Cast(OuterRef("created_at"), DateTimeField())
    month = Cast(TruncMonth(created_at, tzinfo=UTC), DateField())
    return Exists(Invoice.objects.filter(tenant_id=OuterRef("tenant_id"), period=month))


def tenants_to_invoice(*, period: date) -> list[int]:
    """Tenants with no invoice yet for the month of ``period`` and something
    to bill on it: usage in the month, or usage of an invoiced earlier month
    settled after its invoice."""
    period = month_start(period)
    since, until = day_bounds(period, month_end(period))
    with_usage = UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
    late = UsageRecord.objects.filter(invoice__isnull=True, created_at__lt=since).filter(
        _month_invoiced()
    )
    invoiced = Invoice.objects.filter(period=period).values("tenant_id")
    tenant_ids = set()
    for records in (with_usage, late):
        tenant_ids.update(
            records.exclude(tenant_id__in=invoiced).values_list("tenant_id", flat=True).distinct()
        )
    return sorted(tenant_ids)
