"""Reads of the daily usage roll-ups (staff reports across tenants)."""

from datetime import date

from django.db.models import QuerySet

from billing.models import DailyUsage


def daily_usage_list(*, start: date, end: date) -> QuerySet[DailyUsage]:
    """Roll-up rows of ``start``..``end`` (inclusive), by day, tenant and model."""
    return (
        DailyUsage.objects.filter(day__gte=start, day__lte=end)
        .select_related("tenant", "api_key")
        .order_by("day", "tenant__name", "model", "api_key_id")
    )
