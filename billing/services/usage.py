"""Writes for usage records."""

from datetime import UTC, datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import UsageRecord
from billing.selectors.pricing import price_in_force
from tenants.models import Tenant

# The foreign keys are enforced by the database; validating them in Python
# would cost three extra queries on every response.
_NOT_VALIDATED = ["tenant", "api_key", "user", "tier", "price"]


def usage_record_create(
    *,
    response_id: str,
    tenant_id: int,
    api_key_id: int | None = None,
    user_id: int | None = None,
    model: str,
    source: str,
    status: str,
    finish_reason: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    queue_time_ms: int,
    ttft_ms: int | None,
    duration_ms: int,
    worker_id: str = "",
    model_version: str = "",
    regenerated: bool = False,
    tier_id: int | None = None,
    price_id: int | None = None,
    created_at: datetime | None = None,
) -> tuple[UsageRecord, bool]:
    """Record a response's usage exactly once; returns ``(record, created)``.

    ``tier_id`` and ``price_id`` are what the response is billed at: the
    tier it was admitted on and the price in force then (the request path
    passes those its budget hold priced). Without them, the tenant's tier
    now and that tier's price in force today (None when there is none).

    A second call with the same ``response_id`` (a replay, or a concurrent
    writer in another process) returns the existing row with created=False
    and changes nothing. Raises ValidationError for negative counts, cached
    tokens above prompt tokens, or an unknown source or status.

    The tenant's budget counter is not touched here: the request path
    settles the response's budget hold to its cost (``budget_settle``), and
    ``budget_check`` catches the counter up with records written otherwise.
    """
    existing = UsageRecord.objects.filter(response_id=response_id).first()
    if existing is not None:
        return existing, False
    if tier_id is None:
        tier_id = Tenant.objects.values_list("tier_id", flat=True).get(pk=tenant_id)
    if created_at is None:
        created_at = timezone.now()
    if price_id is None:
        day = created_at.astimezone(UTC).date()
        price = price_in_force(tier_id=tier_id, model=model, day=day)
        price_id = price.pk if price is not None else None
    record = UsageRecord(
        response_id=response_id,
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        user_id=user_id,
        model=model,
        source=source,
        status=status,
        finish_reason=finish_reason or "",
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        queue_time_ms=queue_time_ms,
        ttft_ms=ttft_ms,
        duration_ms=duration_ms,
        worker_id=worker_id or "",
        model_version=model_version or "",
        regenerated=regenerated,
        tier_id=tier_id,
        price_id=price_id,
        created_at=created_at,
    )
    # Uniqueness is left to the database: a Python-side check would race.
    record.full_clean(exclude=_NOT_VALIDATED, validate_unique=False, validate_constraints=False)
    try:
        # A savepoint, so that losing the race does not break a caller's
        # enclosing transaction.
        with transaction.atomic():
            record.save(force_insert=True)
    except IntegrityError:
        # Another writer inserted the same response_id after the lookup
        # above; the unique index made this insert wait for its commit.
        existing = UsageRecord.objects.filter(response_id=response_id).first()
        if existing is None:
            raise
        return existing, False
    return record, True
