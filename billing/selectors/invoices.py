"""Reads for invoices: a month's lines computed from the UsageRecords, issued invoices."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.db.models import QuerySet

from billing.models import Invoice, Price, UsageRecord
from billing.models.invoices import to_cents
from billing.selectors.budgets import month_end, month_start
from billing.selectors.pricing import Pricer
from billing.selectors.usage import UsageGroup, records_groups, usage_groups
from tenants.models import Tenant, Tier


class MissingPrice(LookupError):
    """Billable usage of a model with no price in force: the invoice cannot be issued."""


@dataclass(slots=True)
class LineDraft:
    """One invoice line before it is saved: a model's usage at one price."""

    model: str
    price: Price
    first_day: date
    last_day: date
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # Exact, unrounded; the line's amount is this rounded to cents.
    cost: Decimal = Decimal(0)
    # Usage of an earlier month, settled after that month's invoice.
    adjustment: bool = False
    # Batch API usage at its discount is a line of its own (1: interactive).
    price_multiplier: Decimal = Decimal(1)


def invoice_lines_compute(*, tenant: Tenant, period: date) -> list[LineDraft]:
    """The month's billable usage per model and price, from the UsageRecords.

    Each record is billed at the price it carries (the one in force for its
    tier when it happened), so a price change or a tier change mid-month
    splits a model's usage into one line per price, and neither reprices
    earlier usage. Records that carry none (no price was in force) take the
    price in force for their tier and day now. Raises MissingPrice when
    billable usage has no price at all.
    """
    period = month_start(period)
    groups = usage_groups(start=period, end=month_end(period), tenant_ids=[tenant.pk])
    return _drafts(groups, period)


def invoice_lines_billed(*, invoice: Invoice) -> list[LineDraft]:
    """The lines of the records ``invoice`` billed: its month's, and as
    adjustment lines those of earlier months settled after their invoice."""
    groups = records_groups(UsageRecord.objects.filter(invoice=invoice))
    return _drafts(groups, invoice.period)


def _drafts(groups: list[UsageGroup], period: date) -> list[LineDraft]:
    pricer = Pricer()
    lines: dict[tuple[str, int, bool], LineDraft] = {}
    for g in groups:
        if not g.billable:
            continue
        price = pricer.price(price_id=g.price_id, tier_id=g.tier_id, model=g.model, day=g.day)
        if price is None:
            raise MissingPrice(
                f"No price for model {g.model!r} on tier {Tier.objects.get(pk=g.tier_id)} "
                f"on {g.day}: "
                "add one in the admin, then issue the invoice again."
            )
        late = g.day < period
        line = lines.setdefault(
            (g.model, price.pk, late, g.price_multiplier),
            LineDraft(
                g.model,
                price,
                first_day=g.day,
                last_day=g.day,
                adjustment=late,
                price_multiplier=g.price_multiplier,
            ),
        )
        line.first_day, line.last_day = min(line.first_day, g.day), max(line.last_day, g.day)
        line.requests += g.requests
        line.prompt_tokens += g.prompt_tokens
        line.cached_tokens += g.cached_tokens
        line.completion_tokens += g.completion_tokens
        line.cost += g.price_multiplier * price.cost(
            prompt_tokens=g.prompt_tokens,
            cached_tokens=g.cached_tokens,
            completion_tokens=g.completion_tokens,
            service_tier=g.service_tier,
        )
    return sorted(
        lines.values(),
        key=lambda line: (line.adjustment, line.model, line.first_day, -line.price_multiplier),
    )


def invoice_list(*, tenant: Tenant) -> QuerySet[Invoice]:
    return Invoice.objects.filter(tenant=tenant).order_by("-period")


def invoice_get(*, tenant: Tenant, number: str) -> Invoice | None:
    """The tenant's invoice ``number``; another tenant's is indistinguishable from none."""
    return Invoice.objects.filter(tenant=tenant, number=number).prefetch_related("lines").first()


def invoice_differences(*, invoice: Invoice) -> list[str]:
    """How the issued invoice differs from the UsageRecords it billed now (empty: it reproduces).

    Billed records changed after issue or a price edited under an issued
    invoice show up here; records settled after issue do not (the next
    invoice bills them).
    """
    drafts = {
        (d.model, d.price.pk, d.adjustment, d.price_multiplier): d
        for d in invoice_lines_billed(invoice=invoice)
    }
    differences = []
    for line in invoice.lines.all():
        key = (line.model, line.price_id, line.adjustment, line.price_multiplier)
        draft = drafts.pop(key, None)
        if draft is None:
            differences.append(f"{line.model} at price {line.price_id}: no usage now")
            continue
        issued = (line.requests, line.prompt_tokens, line.cached_tokens, line.completion_tokens)
        now = (draft.requests, draft.prompt_tokens, draft.cached_tokens, draft.completion_tokens)
        if issued != now or line.amount != to_cents(draft.cost):
            differences.append(
                f"{line.model} at price {line.price_id}: issued {issued} for {line.amount}, "
                f"records now give {now} for {to_cents(draft.cost)}"
            )
    differences.extend(
        f"{d.model} at price {d.price.pk}: {d.requests} requests not on the invoice"
        for d in drafts.values()
    )
    return differences
