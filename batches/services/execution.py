"""Running a batch's lines: each through the API's own request path.

A feed round (``batch_feed``, one Celery task) keeps the batch's lines in
flight at the pacing bound (pacing.py: the seats of the engines serving
them and a queue behind; never above BATCH_MAX_IN_FLIGHT_PER_BATCH, nor
BATCH_MAX_IN_FLIGHT_PER_TENANT across the tenant's batches), for
BATCH_FEED_ROUND_SECONDS; then it hands over to the next round (another
task), so a cancel, the expiry and other batches' rounds get their turn.
Lines that finish together are recorded together (one transaction).
Each line is built into the surface's ``InferenceRequest`` with
``service_class=batch`` (the engine's class below every interactive one)
and source ``batch`` (billed at the batch price), and started with
``services.generation_start``: authorization, model access, moderation,
budget and rate limits, one usage record under the line's fixed response
id. ``batch_finalize`` writes the output and error files once no line is in
flight.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import Enum
from tempfile import SpooledTemporaryFile
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.core.files import File as DjangoFile
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from batches import metrics
from batches.models import Batch, BatchLine
from batches.services import pacing
from batches.services.files import batch_storage
from inference import services
from inference.api.chat import chat_request
from inference.api.completions import CompletionRequest, completions_create
from inference.api.schemas import ChatCompletionRequest
from inference.errors import APIError, NotFound, as_api_error
from inference.relay import tap as relay
from inference.request import InferenceRequest
from inference.selectors import response_route_get
from tenants.models import ApiKey, Tenant
from wire.requests import ServiceClass
from wire.tracing import TraceContext

logger = logging.getLogger(__name__)

# How often a round looks at the batch's status (cancel, expiry).
POLL_SECONDS = 1.0
# How often at most a round says it lives and renews its lines' claims;
# always a third of BATCH_LINE_LEASE_SECONDS or less (heartbeat_seconds).
HEARTBEAT_SECONDS = 10.0
# Wait after a line was refused for capacity (rate limits, no worker).
BACKOFF_SECONDS = 2.0
# How often a round looks at the fleet again for its in-flight bound.
PACING_SECONDS = 2.0
# What a line that never ran says in the error file, by why it did not.
NOT_RUN = {
    "batch_cancelled": "The batch was cancelled before this request completed.",
    "batch_expired": "This request could not be executed before the completion window expired.",
    "insufficient_quota": "The batch stopped: your organization's budget or quota is exhausted.",
    "invalid_api_key": "The API key that created this batch was revoked or expired.",
}


class Next(Enum):
    """What the task does after a round."""

    FEED = "feed"
    FINALIZE = "finalize"
    NOTHING = "nothing"


class Outcome(Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # Refused for capacity (429 rate limit, 503): the line runs again later.
    RETRY = "retry"
    # The budget or quota is gone: this line errors and the batch stops.
    STOP = "stop"


@dataclass(slots=True)
class LineResult:
    outcome: Outcome
    record: dict[str, Any] | None = None


def _record(line: BatchLine, *, response=None, error=None) -> dict[str, Any]:
    """One line of the output or error file (OpenAI's batch output shape)."""
    return {
        "id": f"batch_req_{line.response_id.rsplit('-', 2)[-2]}{line.line:08x}",
        "custom_id": line.custom_id,
        "response": response,
        "error": error,
    }


def not_run_record(line: BatchLine, code: str) -> dict[str, Any]:
    return _record(line, error={"code": code, "message": NOT_RUN[code]})


# --- Claims ---------------------------------------------------------------


@transaction.atomic
def lines_claim(*, batch_id: str, want: int, limit: int | None = None) -> list[BatchLine]:
    """Up to ``want`` pending lines, within the batch's and the tenant's
    bounds; ``limit``: the batch's pacing bound, if below its cap (counted
    over every feeder of the batch, as the caps are)."""
    batch = Batch.objects.select_for_update().get(pk=batch_id)
    if batch.status != Batch.Status.IN_PROGRESS or batch.stop_code:
        return []
    # The tenant's row serializes claims of its batches, so two feeders
    # never both see room for the same last slot.
    Tenant.objects.select_for_update().only("pk").get(pk=batch.tenant_id)
    running = BatchLine.objects.filter(status=BatchLine.Status.RUNNING)
    in_batch = running.filter(batch_id=batch_id).count()
    in_tenant = running.filter(batch__tenant_id=batch.tenant_id).count()
    per_batch = settings.BATCH_MAX_IN_FLIGHT_PER_BATCH
    if limit is not None:
        per_batch = min(per_batch, limit)
    room = min(
        want,
        per_batch - in_batch,
        settings.BATCH_MAX_IN_FLIGHT_PER_TENANT - in_tenant,
    )
    if room <= 0:
        return []
    lines = list(
        BatchLine.objects.select_for_update(skip_locked=True)
        .filter(batch_id=batch_id, status=BatchLine.Status.PENDING)
        .order_by("line")[:room]
    )
    now = timezone.now()
    BatchLine.objects.filter(pk__in=[line.pk for line in lines]).update(
        status=BatchLine.Status.RUNNING, claimed_at=now, attempts=F("attempts") + 1
    )
    for line in lines:
        line.attempts += 1
    batch.fed_at = now
    batch.save(update_fields=["fed_at"])
    return lines


def stale_lines_release(*, batch_id: str) -> int:
    """Lines claimed by a feeder that died go back to pending."""
    lease = timezone.now() - timedelta(seconds=settings.BATCH_LINE_LEASE_SECONDS)
    return BatchLine.objects.filter(
        batch_id=batch_id, status=BatchLine.Status.RUNNING, claimed_at__lt=lease
    ).update(status=BatchLine.Status.PENDING, claimed_at=None)


def line_finish(*, line: BatchLine, result: LineResult) -> None:
    """Store the line's one result (once: a line no longer running is left)."""
    lines_finish(results=[(line, result)])


@transaction.atomic
def lines_finish(*, results: list[tuple[BatchLine, LineResult]]) -> None:
    """Store each line's one result, all in one transaction and a few
    statements whatever their number (lines that started together finish
    together); a line no longer running is left as it is."""
    retry = [line.pk for line, result in results if result.outcome == Outcome.RETRY]
    if retry:
        BatchLine.objects.filter(pk__in=retry, status=BatchLine.Status.RUNNING).update(
            status=BatchLine.Status.PENDING, claimed_at=None
        )
    ended = {line.pk: (line, result) for line, result in results if result.outcome != Outcome.RETRY}
    if not ended:
        return
    still_running = (
        BatchLine.objects.select_for_update()
        .filter(pk__in=list(ended), status=BatchLine.Status.RUNNING)
        .values_list("pk", flat=True)
    )
    rows: list[BatchLine] = []
    changes: dict[str, dict[str, Any]] = {}
    for pk in still_running:
        line, result = ended[pk]
        succeeded = result.outcome == Outcome.SUCCEEDED
        status = BatchLine.Status.SUCCEEDED if succeeded else BatchLine.Status.FAILED
        rows.append(BatchLine(pk=pk, status=status, result=result.record))
        counts = changes.setdefault(line.batch_id, {"completed": 0, "failed": 0, "stop": False})
        counts["completed" if succeeded else "failed"] += 1
        counts["stop"] |= result.outcome == Outcome.STOP
    if not rows:
        return
    BatchLine.objects.bulk_update(rows, ["status", "result"])
    for batch_id, counts in changes.items():
        update: dict[str, Any] = {
            name: F(name) + counts[name] for name in ("completed", "failed") if counts[name]
        }
        if counts["stop"]:
            update["stop_code"] = "insufficient_quota"
        Batch.objects.filter(pk=batch_id).update(**update)


# --- One line through the request path -------------------------------------


async def line_run(*, line: BatchLine, batch: Batch, api_key: ApiKey) -> LineResult:
    """Run one line as the endpoint would have; its answer or its error."""
    request_id = f"req_{uuid.uuid4().hex}"
    trace = TraceContext(request_id=request_id)
    tenant = api_key.tenant
    ids = (f"{line.response_id}-{i}" if i else line.response_id for i in itertools.count())

    def as_batch(internal: InferenceRequest) -> InferenceRequest:
        return replace(
            internal,
            response_id=next(ids),
            service_class=ServiceClass.BATCH,
            source="batch",
            trace=trace,
        )

    try:
        if batch.endpoint == Batch.Endpoint.CHAT:
            # Claimed before: the earlier attempt's answer, if it has one.
            response = await _resumed(line, api_key) if line.attempts > 1 else None
            if response is None:
                payload = ChatCompletionRequest.model_validate(line.body)
                internal = as_batch(chat_request(payload, tenant=tenant))
                tap = await services.generation_start(
                    request=internal, tenant=tenant, api_key=api_key
                )
                response = await relay.completion_response(tap)
        else:
            payload = CompletionRequest.model_validate(line.body)
            response = await completions_create(
                api_key=api_key, request=payload, headers={}, prepare=as_batch
            )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return await _failed(line, as_api_error(exc), request_id, tenant_id=tenant.pk)
    body = json.loads(response.content)
    response = {"status_code": response.status_code, "request_id": request_id, "body": body}
    return LineResult(Outcome.SUCCEEDED, _record(line, response=response))


async def _resumed(line: BatchLine, api_key: ApiKey):
    """An earlier attempt's answer, read back from its response stream
    (the feeder that started it died); None when it never reached a worker
    or its stream has expired, and the line runs again under its id."""
    try:
        tap = await services.chat_completion_resume(api_key=api_key, response_id=line.response_id)
    except NotFound:
        return None
    logger.info("batch line %s: resumed %s", line.pk, line.response_id)
    return await relay.completion_response(tap)


async def _dispatched(line: BatchLine, tenant_id: int) -> bool:
    """Whether the line's response reached a worker (its route was saved)."""
    try:
        route = await response_route_get(response_id=line.response_id, tenant_id=tenant_id)
    except Exception:
        # The cache is unreachable: assume it did; a retry could only read a
        # spent stream back.
        logger.warning("route of %s unknown", line.response_id, exc_info=True)
        return True
    return route is not None


async def _failed(
    line: BatchLine, error: APIError, request_id: str, *, tenant_id: int
) -> LineResult:
    if error.code == "insufficient_quota":
        outcome = Outcome.STOP
    elif error.status in (429, 503) and not await _dispatched(line, tenant_id):
        # Refused before any worker saw it (limits, no worker yet): later.
        outcome = Outcome.RETRY
    else:
        # Including a generation that failed on its worker: its response id
        # is spent, and running it again would only read that failure back.
        outcome = Outcome.FAILED
    response = {"status_code": error.status, "request_id": request_id, "body": error.payload()}
    return LineResult(outcome, _record(line, response=response))


# --- A feed round ----------------------------------------------------------


def batch_feed(*, batch_id: str) -> Next:
    """One feed round of the batch (a Celery task's body); what to do next."""
    return async_to_sync(_feed)(batch_id)


def _batch_models(batch_id: str) -> list[str]:
    """The models the batch's lines name (what its pacing bound counts)."""
    models = (
        BatchLine.objects.filter(batch_id=batch_id)
        .order_by()
        .values_list("body__model", flat=True)
        .distinct()
    )
    return [m for m in models[:64] if isinstance(m, str)]


def _batch_load(batch_id: str) -> tuple[Batch | None, ApiKey | None]:
    batch = Batch.objects.filter(pk=batch_id).first()
    if batch is None:
        return None, None
    key = (
        ApiKey.objects.select_related("tenant__tier").filter(pk=batch.api_key_id).first()
        if batch.api_key_id
        else None
    )
    return batch, key


def _stop_reason(batch: Batch, key: ApiKey | None) -> str | None:
    """Why the round must stop claiming lines (None: it may go on)."""
    if batch.status != Batch.Status.IN_PROGRESS:
        return "status"
    if batch.stop_code:
        return batch.stop_code
    if timezone.now() >= batch.expires_at:
        return "expired"
    if key is None or key.is_revoked or key.is_expired:
        return "invalid_api_key"
    return None


def _mark_stop(batch_id: str, reason: str) -> None:
    if reason == "expired":
        Batch.objects.filter(pk=batch_id, expired_at__isnull=True).update(expired_at=timezone.now())
    elif reason == "invalid_api_key":
        Batch.objects.filter(pk=batch_id, stop_code="").update(stop_code=reason)


async def _feed(batch_id: str) -> Next:
    batch, key = await sync_to_async(_batch_load)(batch_id)
    if batch is None or batch.done:
        return Next.NOTHING
    await sync_to_async(stale_lines_release)(batch_id=batch_id)
    await sync_to_async(_heartbeat)(batch_id)
    models = await sync_to_async(_batch_models)(batch_id)
    beat = time.monotonic()
    deadline = beat + settings.BATCH_FEED_ROUND_SECONDS
    running: dict[asyncio.Task, BatchLine] = {}
    stopped: str | None = None
    backoff_until = 0.0
    target, paced_at = settings.BATCH_MAX_IN_FLIGHT_PER_BATCH, -PACING_SECONDS
    try:
        while True:
            stopped = _stop_reason(batch, key)
            if stopped is not None:
                break
            now = time.monotonic()
            if now - paced_at >= PACING_SECONDS:
                cap = settings.BATCH_MAX_IN_FLIGHT_PER_BATCH
                target, paced_at = await pacing.in_flight_target_now(models, cap), now
            if now < deadline and now >= backoff_until:
                want = target - len(running)
                if want > 0:
                    claimed = await sync_to_async(lines_claim)(
                        batch_id=batch_id, want=want, limit=target
                    )
                    for line in claimed:
                        task = asyncio.create_task(line_run(line=line, batch=batch, api_key=key))
                        running[task] = line
                        metrics.RUNNING.inc()
            if not running:
                break
            done, _ = await asyncio.wait(
                running, timeout=POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            finished = []
            for task in done:
                line = running.pop(task)
                metrics.RUNNING.dec()
                result = task.result()
                _count(result)
                if result.outcome == Outcome.RETRY:
                    backoff_until = time.monotonic() + BACKOFF_SECONDS
                finished.append((line, result))
            if finished:
                await sync_to_async(lines_finish)(results=finished)
            batch = await sync_to_async(Batch.objects.get)(pk=batch_id)
            if time.monotonic() - beat > heartbeat_seconds():
                ids = [line.pk for line in running.values()]
                await sync_to_async(_heartbeat)(batch_id, ids)
                beat = time.monotonic()
    finally:
        # Cancelled, expired, stopped or this task is going away: the lines
        # still in flight are aborted (their taps abandon the generation).
        for task in running:
            task.cancel()
        finished = []
        for task, line in running.items():
            metrics.RUNNING.dec()
            try:
                result = await task
            except asyncio.CancelledError:
                continue
            _count(result)
            finished.append((line, result))
        if finished:
            await sync_to_async(lines_finish)(results=finished)
        if running:
            await sync_to_async(_lines_unclaim)(lines=list(running.values()))
        # The lines' usage settles in the relay's background tasks, on this
        # loop, which ends with the round: let them finish first.
        await relay.drain_background()
    if stopped is not None and stopped != "status":
        await sync_to_async(_mark_stop)(batch_id, stopped)
    if stopped is not None:
        return Next.FINALIZE
    pending = await sync_to_async(
        BatchLine.objects.filter(
            batch_id=batch_id, status__in=(BatchLine.Status.PENDING, BatchLine.Status.RUNNING)
        ).exists
    )()
    return Next.FEED if pending else Next.FINALIZE


def heartbeat_seconds() -> float:
    """A third of the lease: two missed beats never lose a live claim."""
    return min(HEARTBEAT_SECONDS, settings.BATCH_LINE_LEASE_SECONDS / 3)


def _heartbeat(batch_id: str, line_ids: list[int] = ()) -> None:
    # A live feeder, even one waiting for room: the sweep leaves it alone,
    # and its lines' claims stay fresh however long they generate.
    now = timezone.now()
    Batch.objects.filter(pk=batch_id).update(fed_at=now)
    if line_ids:
        BatchLine.objects.filter(pk__in=line_ids, status=BatchLine.Status.RUNNING).update(
            claimed_at=now
        )


def _count(result: LineResult) -> None:
    metrics.LINES.labels(result.outcome.value).inc()
    if result.outcome == Outcome.SUCCEEDED:
        usage = (result.record["response"]["body"] or {}).get("usage") or {}
        metrics.TOKENS.inc(usage.get("completion_tokens", 0))


def _lines_unclaim(*, lines: list[BatchLine]) -> None:
    # Aborted mid-generation: pending again (a cancel or the expiry then
    # turns them into error lines; a new round runs them again otherwise).
    BatchLine.objects.filter(
        pk__in=[line.pk for line in lines], status=BatchLine.Status.RUNNING
    ).update(status=BatchLine.Status.PENDING, claimed_at=None)


# --- Finalize --------------------------------------------------------------


def batch_finalize(*, batch_id: str) -> bool:
    """Write the output and error files and end the batch; False: not yet.

    Not yet while a live feeder still has lines in flight (it finalizes
    after them), or while the batch has lines left and nothing ended it.
    Lines that never ran error with why: cancelled, expired, the budget.
    """
    lease = timezone.now() - timedelta(seconds=settings.BATCH_LINE_LEASE_SECONDS)
    with transaction.atomic():
        batch = Batch.objects.select_for_update().filter(pk=batch_id).first()
        if batch is None or batch.done:
            return True
        lines = BatchLine.objects.filter(batch_id=batch_id)
        if lines.filter(status=BatchLine.Status.RUNNING, claimed_at__gte=lease).exists():
            return False
        if batch.status == Batch.Status.CANCELLING:
            final, code = Batch.Status.CANCELLED, "batch_cancelled"
        elif batch.expired_at is not None or timezone.now() >= batch.expires_at:
            final, code = Batch.Status.EXPIRED, "batch_expired"
        elif batch.stop_code:
            final, code = Batch.Status.COMPLETED, batch.stop_code
        elif batch.status in (Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING):
            if lines.exclude(
                status__in=(BatchLine.Status.SUCCEEDED, BatchLine.Status.FAILED)
            ).exists():
                return True
            final, code = Batch.Status.COMPLETED, None
        else:
            # Still validating: the validation task decides.
            return True
        if code is not None:
            left = lines.filter(
                Q(status=BatchLine.Status.PENDING) | Q(status=BatchLine.Status.RUNNING)
            )
            for line in left.iterator(chunk_size=1000):
                line.status = BatchLine.Status.FAILED
                line.result = not_run_record(line, code)
                line.save(update_fields=["status", "result"])
        now = timezone.now()
        if final == Batch.Status.COMPLETED and batch.status != Batch.Status.FINALIZING:
            batch.status = Batch.Status.FINALIZING
            batch.finalizing_at = now
            batch.save(update_fields=["status", "finalizing_at"])
    # The files outside the lock: a large batch takes a while to write.
    batch.output_file = _results_file(batch, BatchLine.Status.SUCCEEDED, "output")
    batch.error_file = _results_file(batch, BatchLine.Status.FAILED, "errors")
    batch.completed = BatchLine.objects.filter(
        batch_id=batch_id, status=BatchLine.Status.SUCCEEDED
    ).count()
    batch.failed = BatchLine.objects.filter(
        batch_id=batch_id, status=BatchLine.Status.FAILED
    ).count()
    batch.status = final
    stamp = {
        Batch.Status.COMPLETED: "completed_at",
        Batch.Status.CANCELLED: "cancelled_at",
        Batch.Status.EXPIRED: "expired_at",
    }[final]
    if getattr(batch, stamp) is None:
        setattr(batch, stamp, timezone.now())
    batch.save(update_fields=["output_file", "error_file", "completed", "failed", "status", stamp])
    metrics.DURATION.labels(final).observe((timezone.now() - batch.created_at).total_seconds())
    return True


def _results_file(batch: Batch, status: str, kind: str):
    records = (
        BatchLine.objects.filter(batch_id=batch.pk, status=status)
        .order_by("line")
        .values_list("result", flat=True)
    )
    with SpooledTemporaryFile(max_size=8 << 20) as spool:
        count = 0
        for record in records.iterator(chunk_size=1000):
            spool.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            count += 1
        if not count:
            return None
        spool.seek(0)
        return _file_from(batch, spool, f"{batch.pk}_{kind}.jsonl")


def _file_from(batch: Batch, spool, filename: str):
    from batches.models import File

    row = File(tenant_id=batch.tenant_id, purpose=File.Purpose.BATCH_OUTPUT, filename=filename)
    storage = batch_storage()
    row.storage_name = storage.save(f"{batch.tenant_id}/{row.id}.jsonl", DjangoFile(spool))
    row.bytes = storage.size(row.storage_name)
    row.save(force_insert=True)
    return row


# --- Sweep -----------------------------------------------------------------


def batches_sweep() -> list[tuple[str, Next]]:
    """Batches whose tasks were lost: what each needs next (the beat's safety net).

    Past their window: finalize (expire). In progress but no feeder seen
    for a lease: feed again. Cancelling or finalizing: finalize.
    """
    now = timezone.now()
    # A live feeder beats at least every third of a lease, and the next
    # round follows the last within seconds.
    quiet = now - timedelta(seconds=settings.BATCH_LINE_LEASE_SECONDS)
    work: list[tuple[str, Next]] = []
    active = Batch.objects.filter(
        status__in=(Batch.Status.IN_PROGRESS, Batch.Status.CANCELLING, Batch.Status.FINALIZING)
    )
    for batch in active.only("id", "status", "expires_at", "fed_at", "in_progress_at"):
        if batch.status != Batch.Status.IN_PROGRESS or now >= batch.expires_at:
            work.append((batch.pk, Next.FINALIZE))
        elif (batch.fed_at or batch.in_progress_at or now) < quiet:
            work.append((batch.pk, Next.FEED))
    return work
