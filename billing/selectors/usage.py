"""Usage reads: records, totals and per-day groups, priced."""

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import BooleanField, Case, Count, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce, TruncDate

from billing.models import UsageRecord
from billing.selectors.pricing import BILLABLE_STATUSES, Pricer
from tenants.models import ApiKey, Tenant


def usage_list(
    *, tenant: Tenant, since: datetime | None = None, until: datetime | None = None
) -> QuerySet[UsageRecord]:
    """The tenant's records, newest first; ``since`` inclusive, ``until`` exclusive."""
    records = UsageRecord.objects.filter(tenant=tenant)
    if since is not None:
        records = records.filter(created_at__gte=since)
    if until is not None:
        records = records.filter(created_at__lt=until)
    return records.order_by("-created_at", "-id")


def usage_month_tokens(*, tenant_id: int, period: str) -> int:
    """Billable tokens of the tenant's usage records in the month ``period`` (YYYYMM).

    Seeds the rate limiter's monthly quota counter (``tenants.ratelimit``),
    which charges what is billed: failed responses count nothing.
    """
    since = datetime(int(period[:4]), int(period[4:]), 1, tzinfo=UTC)
    # Only the tenant is filtered on: an unsaved instance with the pk suffices.
    records = usage_list(tenant=Tenant(pk=tenant_id), since=since)
    totals = records.filter(status__in=BILLABLE_STATUSES).aggregate(
        prompt=Coalesce(Sum("prompt_tokens"), 0), completion=Coalesce(Sum("completion_tokens"), 0)
    )
    return int(totals["prompt"]) + int(totals["completion"])


def usage_totals(*, tenant: Tenant, since: datetime | None = None) -> dict[str, int]:
    """Sums over the tenant's records since ``since`` (all time when None).

    Keys: requests, prompt_tokens, cached_tokens, completion_tokens,
    total_tokens. Zero, never None, when there are no records.
    """
    totals = usage_list(tenant=tenant, since=since).aggregate(
        requests=Count("id"),
        prompt_tokens=Coalesce(Sum("prompt_tokens"), 0),
        cached_tokens=Coalesce(Sum("cached_tokens"), 0),
        completion_tokens=Coalesce(Sum("completion_tokens"), 0),
    )
    totals = {key: int(value) for key, value in totals.items()}
    totals["total_tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]
    return totals


def usage_get(*, tenant: Tenant, response_id: str) -> UsageRecord | None:
    """The record for ``response_id`` if it belongs to ``tenant``, else None.

    Another tenant's response id is indistinguishable from an unknown one.
    """
    return UsageRecord.objects.filter(tenant=tenant, response_id=response_id).first()


@dataclass(slots=True)
class UsageGroup:
    """Usage of one tenant, day, key, model, tier and price, split by billability.

    ``tier_id`` and ``price_id`` are the records' own (the tier they were
    admitted on, the price in force then; ``price_id`` None where none was).
    """

    tenant_id: int
    tier_id: int
    day: date
    api_key_id: int | None
    model: str
    billable: bool
    price_id: int | None
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    # The service tier served at: the price's multiplier applies.
    service_tier: str = "default"
    # The records' fraction of the price (batch usage: the batch discount).
    price_multiplier: Decimal = Decimal(1)
    # UsageRecord.Source: api, console or batch.
    source: str = "api"


def day_bounds(start: date, end: date) -> tuple[datetime, datetime]:
    """UTC datetimes covering the days ``start`` to ``end``, both inclusive."""
    since = datetime.combine(start, time.min, tzinfo=UTC)
    return since, datetime.combine(end + timedelta(days=1), time.min, tzinfo=UTC)


def usage_groups(
    *, start: date, end: date, tenant_ids: list[int] | None = None
) -> list[UsageGroup]:
    """UsageRecords of days ``start``..``end`` (inclusive) summed per tenant, day, key, model.

    One GROUP BY in the database; pricing happens on the sums, which is
    exact because a cost is linear in the token counts.
    """
    since, until = day_bounds(start, end)
    records = UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
    if tenant_ids is not None:
        records = records.filter(tenant_id__in=tenant_ids)
    return records_groups(records)


def records_groups(records: QuerySet[UsageRecord]) -> list[UsageGroup]:
    """``records`` summed per tenant, day, key, model, tier, price and billability."""
    rows = (
        records.annotate(
            day=TruncDate("created_at", tzinfo=UTC),
            # Rows written without a tier (none since migration 0004) bill
            # at the tenant's current one.
            record_tier=Coalesce("tier_id", "tenant__tier_id"),
            billable=Case(
                When(status__in=BILLABLE_STATUSES, then=Value(True)),
                default=Value(False),
                output_field=BooleanField(),
            ),
        )
        .values(
            "tenant_id",
            "record_tier",
            "day",
            "api_key_id",
            "model",
            "billable",
            "price_id",
            "service_tier",
            "price_multiplier",
            "source",
        )
        .annotate(
            requests=Count("id"),
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_tokens"),
            completion=Sum("completion_tokens"),
        )
        .order_by(
            "day",
            "tenant_id",
            "model",
            "api_key_id",
            "record_tier",
            "price_id",
            "service_tier",
            "price_multiplier",
            "source",
        )
    )
    return [
        UsageGroup(
            tenant_id=row["tenant_id"],
            tier_id=row["record_tier"],
            day=row["day"],
            api_key_id=row["api_key_id"],
            model=row["model"],
            billable=row["billable"],
            price_id=row["price_id"],
            requests=row["requests"],
            prompt_tokens=int(row["prompt"]),
            cached_tokens=int(row["cached"]),
            completion_tokens=int(row["completion"]),
            service_tier=row["service_tier"],
            price_multiplier=row["price_multiplier"],
            source=row["source"],
        )
        for row in rows
    ]


def usage_daily(*, tenant: Tenant, start: date, end: date, group_by: str) -> list[dict]:
    """The tenant's usage and cost per day and key (or model), ``start``..``end`` inclusive.

    ``group_by`` is "api_key" (group: the key's name and prefix, "Console"
    for console usage) or "model". Each dict: day, group, requests,
    prompt_tokens, cached_tokens, completion_tokens, cost (Decimal, exact,
    unrounded). Tokens count every response; cost counts billable ones
    (failed responses are not billed), at the price in force on the day for
    the tenant's tier: cached prompt tokens at the cached price, the rest of
    the prompt at the prompt price. Sorted by day, then group.
    """
    if group_by not in ("api_key", "model"):
        raise ValueError(f"group_by must be 'api_key' or 'model', not {group_by!r}")
    groups = usage_groups(start=start, end=end, tenant_ids=[tenant.pk])
    pricer = Pricer()
    key_names = {
        key.pk: str(key)
        for key in ApiKey.objects.filter(pk__in={g.api_key_id for g in groups if g.api_key_id})
    }
    merged: dict[tuple[date, str], dict] = {}
    for g in groups:
        if group_by == "model":
            label = g.model
        else:
            label = key_names.get(g.api_key_id, "Deleted key") if g.api_key_id else "Console"
        if g.source == UsageRecord.Source.BATCH:
            # Batch usage, billed at its discount, is a row of its own.
            label = f"{label} (batch)"
        row = merged.setdefault(
            (g.day, label),
            {
                "day": g.day,
                "group": label,
                "requests": 0,
                "prompt_tokens": 0,
                "cached_tokens": 0,
                "completion_tokens": 0,
                "cost": Decimal(0),
            },
        )
        row["requests"] += g.requests
        row["prompt_tokens"] += g.prompt_tokens
        row["cached_tokens"] += g.cached_tokens
        row["completion_tokens"] += g.completion_tokens
        if g.billable:
            row["cost"] += pricer.cost(g)
    return [merged[k] for k in sorted(merged)]


@dataclass(slots=True, frozen=True)
class TierShare:
    """A tenant's part of its tier's generated tokens over a recent window.

    Counts only, never who the other tenants are: the console shows a
    tenant admin how the engine's fair share treated them under contention.
    """

    since: datetime
    tenant_tokens: int
    tier_tokens: int
    # Tenants of the tier with usage in the window (this one included).
    active_tenants: int

    @property
    def share(self) -> float:
        """The tenant's fraction of the tier's generated tokens."""
        return self.tenant_tokens / self.tier_tokens if self.tier_tokens else 0.0

    @property
    def fair_share(self) -> float:
        """An equal split between the tier's active tenants."""
        return 1 / self.active_tenants if self.active_tenants else 0.0

    @property
    def contended(self) -> bool:
        """Another tenant of the tier generated tokens in the window too."""
        return self.active_tenants > 1


def tier_share(*, tenant: Tenant, window: timedelta = timedelta(hours=1)) -> TierShare:
    """``tenant``'s generated (completion) tokens over the last ``window``
    against its tier's, from the usage records (their tier when admitted)."""
    since = datetime.now(UTC) - window
    records = UsageRecord.objects.filter(tier_id=tenant.tier_id, created_at__gte=since)
    totals = records.aggregate(
        tier=Coalesce(Sum("completion_tokens"), 0),
        mine=Coalesce(Sum("completion_tokens", filter=Q(tenant_id=tenant.pk)), 0),
        tenants=Count("tenant_id", distinct=True, filter=Q(completion_tokens__gt=0)),
    )
    return TierShare(
        since=since,
        tenant_tokens=int(totals["mine"]),
        tier_tokens=int(totals["tier"]),
        active_tenants=int(totals["tenants"]),
    )
