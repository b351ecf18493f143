"""Batches: create, validate and cancel (the lines run in ``execution``)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from batches import jsonl
from batches.errors import InvalidBatchRequest
from batches.models import Batch, BatchLine, File
from batches.selectors import batch_get, file_get
from batches.services.files import file_lines
from batches.tokens import TokenCounter
from tenants.models import ApiKey, Tenant, Tier

COMPLETION_WINDOWS = {"24h": timedelta(hours=24)}
# OpenAI's metadata bounds.
MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
# Lines inserted per statement while a file is split.
INSERT_CHUNK = 1000
RESPONSE_PREFIX = {Batch.Endpoint.CHAT: "chatcmpl", Batch.Endpoint.COMPLETIONS: "cmpl"}


def _metadata_check(metadata: dict | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidBatchRequest(
            f"metadata has more than {MAX_METADATA_KEYS} keys.", param="metadata"
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(value, str):
            raise InvalidBatchRequest(
                f"metadata keys are strings of at most {MAX_METADATA_KEY} characters and "
                "values are strings.",
                param="metadata",
            )
        if len(value) > MAX_METADATA_VALUE:
            raise InvalidBatchRequest(
                f"metadata values are at most {MAX_METADATA_VALUE} characters.", param="metadata"
            )


@transaction.atomic
def batch_create(
    *,
    api_key: ApiKey,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: dict[str, str] | None = None,
) -> Batch:
    """A batch of ``api_key``'s tenant, validating; its lines are checked by a task."""
    tenant = api_key.tenant
    if endpoint not in Batch.Endpoint.values:
        raise InvalidBatchRequest(
            f"Invalid endpoint {endpoint!r}: one of {', '.join(Batch.Endpoint.values)}.",
            param="endpoint",
        )
    window = COMPLETION_WINDOWS.get(completion_window)
    if window is None:
        raise InvalidBatchRequest(
            f"Invalid completion_window {completion_window!r}: only '24h' is supported.",
            param="completion_window",
        )
    _metadata_check(metadata)
    file = file_get(tenant=tenant, file_id=input_file_id)
    if file.purpose != File.Purpose.BATCH:
        raise InvalidBatchRequest(
            f"File {file.pk} has purpose {file.purpose!r}; a batch needs a 'batch' file.",
            param="input_file_id",
        )
    now = timezone.now()
    batch = Batch(
        tenant=tenant,
        api_key=api_key,
        endpoint=endpoint,
        input_file_id=file.pk,
        completion_window=completion_window,
        metadata=metadata,
        created_at=now,
        expires_at=now + window,
    )
    batch.full_clean()
    batch.save(force_insert=True)
    from batches import tasks

    transaction.on_commit(lambda: tasks.enqueue(tasks.batch_validate, batch.pk))
    return batch


def batch_validate(*, batch_id: str) -> None:
    """Check the input file line by line; split it into lines or fail the batch.

    Idempotent: a batch no longer validating is left alone. The file is
    streamed and its lines inserted in chunks inside one transaction, so a
    bad line anywhere rolls every insert back.
    """
    batch = Batch.objects.select_related("tenant").filter(pk=batch_id).first()
    if batch is None or batch.status != Batch.Status.VALIDATING:
        return
    file = File.objects.filter(tenant=batch.tenant, pk=batch.input_file_id).first()
    if file is None:
        errors = [
            jsonl.LineError("missing_file", f"The input file {batch.input_file_id} was deleted.")
        ]
        _fail(batch_id, errors)
        return
    prefix = f"{RESPONSE_PREFIX[batch.endpoint]}-{batch.pk.removeprefix('batch_')}"
    errors: list[jsonl.LineError] = []
    counter = TokenCounter(batch.tenant.tier)
    tokens = 0
    try:
        with transaction.atomic():
            locked = Batch.objects.select_for_update().get(pk=batch_id)
            if locked.status != Batch.Status.VALIDATING:
                return
            chunk: list[BatchLine] = []
            total = 0
            for item in jsonl.lines_checked(file_lines(file=file), endpoint=batch.endpoint):
                if isinstance(item, jsonl.LineError):
                    errors.append(item)
                    continue
                if errors:
                    continue
                chunk.append(
                    BatchLine(
                        batch_id=batch_id,
                        line=item.line,
                        custom_id=item.custom_id,
                        body=item.body,
                        response_id=f"{prefix}-{item.line}",
                    )
                )
                total += 1
                tokens += counter.line_tokens(endpoint=batch.endpoint, body=item.body)
                if len(chunk) >= INSERT_CHUNK:
                    BatchLine.objects.bulk_create(chunk)
                    chunk = []
            if not errors:
                problem = _queue_check(batch.tenant, tokens)
                if problem is not None:
                    errors.append(problem)
            if errors:
                raise _Invalid
            BatchLine.objects.bulk_create(chunk)
            locked.status = Batch.Status.IN_PROGRESS
            locked.in_progress_at = timezone.now()
            locked.total = total
            locked.enqueued_tokens = tokens
            locked.save(update_fields=["status", "in_progress_at", "total", "enqueued_tokens"])
            from batches import tasks

            transaction.on_commit(lambda: tasks.enqueue(tasks.batch_feed, batch_id))
    except _Invalid:
        _fail(batch_id, errors)


def _queue_check(tenant: Tenant, tokens: int) -> jsonl.LineError | None:
    """The tier's batch queue limit, counting the tenant's batches in progress.

    Called inside the validating transaction; the tenant's row lock makes
    two batches validated at once count each other.
    """
    tier = Tier.objects.get(pk=Tenant.objects.select_for_update().get(pk=tenant.pk).tier_id)
    queued = (
        Batch.objects.filter(tenant=tenant, status=Batch.Status.IN_PROGRESS).aggregate(
            total=Sum("enqueued_tokens")
        )["total"]
        or 0
    )
    if queued + tokens <= tier.batch_queue_tokens:
        return None
    return jsonl.LineError(
        "token_limit_exceeded",
        f"Enqueued token limit reached for your organization: this batch holds {tokens} "
        f"tokens, batches in progress {queued}, and the {tier} tier's limit is "
        f"{tier.batch_queue_tokens} enqueued tokens. Try again once some in_progress "
        "batches have completed.",
    )


class _Invalid(Exception):
    """Rolls the inserted lines back when the file has a bad line."""


def _fail(batch_id: str, errors: list[jsonl.LineError]) -> None:
    Batch.objects.filter(pk=batch_id, status=Batch.Status.VALIDATING).update(
        status=Batch.Status.FAILED,
        failed_at=timezone.now(),
        errors={"object": "list", "data": [e.as_dict() for e in errors]},
    )


@transaction.atomic
def batch_cancel(*, tenant: Tenant, batch_id: str) -> Batch:
    """Stop feeding the batch; in-flight lines are aborted, the rest error.

    Cancelling a batch already cancelling or cancelled answers it as it is;
    a finished one cannot be cancelled.
    """
    batch_get(tenant=tenant, batch_id=batch_id)
    batch = Batch.objects.select_for_update().get(pk=batch_id)
    if batch.status in (Batch.Status.CANCELLING, Batch.Status.CANCELLED):
        return batch
    if batch.status not in (Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS):
        raise InvalidBatchRequest(
            f"Cannot cancel a batch with status {batch.status}.", param="batch_id"
        )
    batch.status = Batch.Status.CANCELLING
    batch.cancelling_at = timezone.now()
    batch.save(update_fields=["status", "cancelling_at"])
    from batches import tasks

    transaction.on_commit(lambda: tasks.enqueue(tasks.batch_finalize, batch_id))
    return batch
