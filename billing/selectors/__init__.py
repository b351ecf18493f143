"""Reads for billing. Usage reads are scoped to one tenant.

Sync ORM functions; async callers wrap them with asgiref's sync_to_async.
"""

from billing.selectors.budgets import month_end, month_spend, month_start
from billing.selectors.pricing import BILLABLE_STATUSES, PriceBook
from billing.selectors.usage import (
    TierShare,
    UsageGroup,
    day_bounds,
    tier_share,
    usage_daily,
    usage_get,
    usage_groups,
    usage_list,
    usage_month_tokens,
    usage_totals,
)

__all__ = [
    "BILLABLE_STATUSES",
    "PriceBook",
    "TierShare",
    "UsageGroup",
    "day_bounds",
    "month_end",
    "month_spend",
    "month_start",
    "tier_share",
    "usage_daily",
    "usage_get",
    "usage_groups",
    "usage_list",
    "usage_month_tokens",
    "usage_totals",
]
