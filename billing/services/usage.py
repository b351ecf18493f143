"""The one writer of usage records: from a response's usage entry."""

from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction

from billing.models import UsageRecord
from billing.selectors.pricing import price_in_force
from tenants.models import Tenant
from wire.usage import UsageEntry

# The foreign keys are enforced by the database; validating them in Python
# would cost three extra queries on every response.
_NOT_VALIDATED = ["tenant", "api_key", "user", "tier", "price"]


def price_multiplier_for(*, source: str) -> Decimal:
    """The fraction of the price a response of ``source`` pays: the batch
    discount (BATCH_PRICE_MULTIPLIER) for Batch API lines, else all of it."""
    if source == UsageRecord.Source.BATCH:
        return settings.BATCH_PRICE_MULTIPLIER
    return Decimal(1)


def usage_record_create(*, entry: UsageEntry) -> tuple[UsageRecord, bool]:
    """Record a response's usage exactly once; returns ``(record, created)``.

    ``entry`` is the response's usage as ``wire.usage`` carries it (the
    worker's, or the relay's at the terminal event): every field of the
    record comes from it, here and nowhere else. Its tag's ``tier_id`` and
    ``price_id`` are what the response is billed at: the tier it was
    admitted on and the price its budget hold was priced at. Without them,
    the tenant's tier now and that tier's price in force on the record's
    day (None when there is none).

    A second call with the same ``response_id`` (a replay, or a concurrent
    writer in another process) returns the existing row with created=False
    and changes nothing. Raises ValidationError for negative counts, cached
    tokens above prompt tokens, or an unknown source or status.

    The tenant's budget counter is not touched here: the request path
    settles the response's budget hold to its cost (``budget_settle``), and
    ``budget_check`` catches the counter up with records written otherwise.
    """
    existing = UsageRecord.objects.filter(response_id=entry.response_id).first()
    if existing is not None:
        return existing, False
    tag = entry.tag
    tier_id = tag.tier_id
    if tier_id is None:
        tier_id = Tenant.objects.values_list("tier_id", flat=True).get(pk=entry.tenant_id)
    created_at = datetime.fromtimestamp(entry.created_at, UTC)
    price_id = tag.price_id
    if price_id is None:
        price = price_in_force(tier_id=tier_id, model=entry.model, day=created_at.date())
        price_id = price.pk if price is not None else None
    multiplier = price_multiplier_for(source=tag.source)
    record = UsageRecord(
        response_id=entry.response_id,
        tenant_id=entry.tenant_id,
        api_key_id=tag.api_key_id,
        user_id=tag.user_id,
        model=entry.model,
        source=tag.source,
        status=entry.status,
        finish_reason=entry.finish_reason or "",
        prompt_tokens=entry.prompt_tokens,
        cached_tokens=entry.cached_tokens,
        completion_tokens=entry.completion_tokens,
        queue_time_ms=entry.queue_time_ms,
        ttft_ms=entry.ttft_ms,
        duration_ms=entry.duration_ms,
        worker_id=entry.worker_id or "",
        model_version=entry.model_version or "",
        regenerated=tag.regenerated,
        tier_id=tier_id,
        price_id=price_id,
        service_tier=tag.service_tier,
        price_multiplier=multiplier,
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
        existing = UsageRecord.objects.filter(response_id=entry.response_id).first()
        if existing is None:
            raise
        return existing, False
    return record, True
