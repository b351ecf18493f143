"""Reads for usage records. Every read is scoped to one tenant.

Sync ORM functions; async callers wrap them with asgiref's sync_to_async.
"""

from datetime import datetime

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import Coalesce

from billing.models import UsageRecord
from tenants.models import Tenant


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
