"""Daily usage roll-ups, rebuilt from the UsageRecords."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from django.db import transaction

from billing.models import DailyUsage
from billing.selectors.pricing import Pricer
from billing.selectors.usage import usage_groups
from billing.services.locks import lock_for_transaction


@transaction.atomic
def daily_usage_rollup(*, day: date) -> int:
    """Replace ``day``'s DailyUsage rows with sums of its UsageRecords; returns the row count.

    Safe to rerun and to run concurrently: the day's rows are rebuilt under
    a lock, so the result is the same however often it runs.
    """
    lock_for_transaction(f"billing:rollup:{day.isoformat()}")
    pricer = Pricer()
    rows: dict[tuple[int, int | None, str], DailyUsage] = {}
    for g in usage_groups(start=day, end=day):
        # A tier change that day gives a key's model two prices; the row's
        # cost sums both and it names the first.
        price = pricer.price(price_id=g.price_id, tier_id=g.tier_id, model=g.model, day=day)
        row = rows.setdefault(
            (g.tenant_id, g.api_key_id, g.model),
            DailyUsage(
                day=day,
                tenant_id=g.tenant_id,
                api_key_id=g.api_key_id,
                model=g.model,
                requests=0,
                prompt_tokens=0,
                cached_tokens=0,
                completion_tokens=0,
                cost=Decimal(0),
                price=price,
            ),
        )
        row.requests += g.requests
        row.prompt_tokens += g.prompt_tokens
        row.cached_tokens += g.cached_tokens
        row.completion_tokens += g.completion_tokens
        if g.billable:
            row.cost += pricer.cost(g)
    DailyUsage.objects.filter(day=day).delete()
    DailyUsage.objects.bulk_create(rows.values())
    return len(rows)
