"""Writes for usage records; each new one also feeds its tenant's spend counter."""

import functools

from django.db import IntegrityError, transaction

from billing.models import UsageRecord
from billing.services.budgets import spend_record

# The foreign keys are enforced by the database; validating them in Python
# would cost three extra queries on every response.
_NOT_VALIDATED = ["tenant", "api_key", "user"]


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
) -> tuple[UsageRecord, bool]:
    """Record a response's usage exactly once; returns ``(record, created)``.

    A second call with the same ``response_id`` (a replay, or a concurrent
    writer in another process) returns the existing row with created=False
    and changes nothing. Raises ValidationError for negative counts, cached
    tokens above prompt tokens, or an unknown source or status.
    """
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
    )
    # Uniqueness is left to the database: a Python-side check would race.
    record.full_clean(exclude=_NOT_VALIDATED, validate_unique=False, validate_constraints=False)

    existing = UsageRecord.objects.filter(response_id=response_id).first()
    if existing is not None:
        return existing, False
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
    # After commit: the counter must never count a row that rolled back.
    # robust: a cache outage costs the counter (re-seeded later), not the row.
    transaction.on_commit(functools.partial(spend_record, record=record), robust=True)
    return record, True
