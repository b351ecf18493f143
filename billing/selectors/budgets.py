"""Reads for budgets: a tenant's exact spend in a month."""

from datetime import date
from decimal import Decimal

from billing.selectors.pricing import Pricer
from billing.selectors.usage import usage_groups
from tenants.models import Tenant


def month_start(day: date) -> date:
    return day.replace(day=1)


def month_end(period: date) -> date:
    """The last day of the month starting at ``period``."""
    following = date(period.year + period.month // 12, period.month % 12 + 1, 1)
    return date.fromordinal(following.toordinal() - 1)


def month_spend(*, tenant: Tenant, period: date) -> Decimal:
    """Exact (unrounded) cost of the tenant's billable usage in the month of ``period``,
    each record at the price it carries.

    An aggregate over the month's records: for budget checks and for
    re-seeding the request path's counter, never per request.
    """
    period = month_start(period)
    pricer = Pricer()
    total = Decimal(0)
    for g in usage_groups(start=period, end=month_end(period), tenant_ids=[tenant.pk]):
        if g.billable:
            total += pricer.cost(g)
    return total
