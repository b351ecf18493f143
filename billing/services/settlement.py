"""Usage settlement: the worker's usage stream into UsageRecords, once each.

The worker appends every billed response's terminal usage to the usage
stream (``wire.usage``). ``usage_settle_pending`` reads it as one consumer
of the settlers' group and, per entry: writes the response's UsageRecord
(idempotent on the response id, dated when the response was requested),
then settles its budget hold and rate-limit reservation (``claims_settle``,
idempotent per response id in the ledger and limiter scripts), then
acknowledges it. A settler that dies anywhere in between leaves the entry
pending; another settler claims it once it has been idle for
``CLAIM_IDLE_MS`` and the repeat changes nothing. The web tier's relay
writes the same record at the terminal event when it can (the fast path):
both converge on one row.

An entry that cannot be settled (unparseable, unknown tenant, a record the
database refuses, or any other exception while settling it) is set aside
as a ``UsageDeadLetter`` (logged, counted, shown in the admin) and
acknowledged, so it never blocks the entries behind it. The database
being unreachable (a connection-level error) is not the entry's fault: the
batch stops there and the rest stay pending for the next run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, InterfaceError, OperationalError, transaction
from redis.exceptions import RedisError

from billing import metrics
from billing.models import Price, UsageDeadLetter, UsageRecord
from billing.selectors.pricing import BILLABLE_STATUSES
from billing.services.budgets import BudgetHold, Rates, budget_settle_sync
from billing.services.usage import price_multiplier_for, usage_record_create
from tenants import ratelimit
from tenants.models import ApiKey, Tenant
from tenants.ratelimit import Ticket
from wire.bus import BusUnavailable
from wire.usage import (
    CLAIM_IDLE_MS,
    Delivery,
    InvalidUsageEntry,
    UsageEntry,
    UsageStream,
    get_usage_stream,
)

logger = logging.getLogger(__name__)

# Errors that make an entry poison: the record itself is refused.
_POISON = (ValidationError, IntegrityError, DataError, Tenant.DoesNotExist)
# Connection-level errors: the database, not the entry (down, restarting).
# Anything else raised while settling one entry is that entry's fault.
_TRANSIENT_DB = (OperationalError, InterfaceError)


@dataclass(slots=True)
class SettleReport:
    """What one run did."""

    recorded: int = 0
    # Entries whose record existed already (the fast path, a redelivery).
    known: int = 0
    dead: int = 0
    # Stopped early: the database could not be written (entries stay pending).
    interrupted: bool = False


def claims_settle(
    *,
    hold: BudgetHold,
    ticket: Ticket,
    status: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
) -> None:
    """Settle a response's budget hold and rate-limit reservation (idempotent).

    The hold becomes spend at what the record bills (failed: nothing). A
    response that ended before its first token is refunded from the
    per-minute windows; the monthly quota is charged what the record bills.
    A second call for the same response finds both settled and does nothing.
    """
    billed = prompt_tokens + completion_tokens
    refund = status != "completed" and completion_tokens == 0
    try:
        budget_settle_sync(
            hold=hold,
            status=status,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
        )
    finally:
        # Looked up through the package, as rate_limit_settle does.
        ratelimit.get_limiter().settle(
            ticket=ticket,
            tokens=0 if refund else billed,
            quota_tokens=billed if status in BILLABLE_STATUSES else 0,
        )


def usage_entry_record(*, entry: UsageEntry) -> bool:
    """Write the response's one UsageRecord from its usage entry (idempotent);
    True when this call wrote it.

    The settler calls it for each entry of the usage stream; the request
    path calls it at the response's end (the fast path), and when the
    database is down appends the entry to the stream instead. Both take
    the same entry to the same writer, so they converge on one row.
    """
    _, created = usage_record_create(entry=entry)
    return created


def usage_settle_pending(
    *,
    consumer: str,
    stream: UsageStream | None = None,
    batch: int = 200,
    max_batches: int = 50,
    min_idle_ms: int = CLAIM_IDLE_MS,
) -> SettleReport:
    """Settle what the usage stream holds, up to ``max_batches`` batches.

    ``consumer`` names this settler in the group (one per process).
    Raises BusUnavailable when the stream cannot be read.
    """
    stream = stream if stream is not None else get_usage_stream()
    report = SettleReport()
    for _ in range(max_batches):
        deliveries = stream.read(consumer, batch, min_idle_ms)
        if not deliveries:
            break
        done = _settle_batch(deliveries, report)
        stream.ack(done)
        if report.interrupted:
            break
    metrics.BACKLOG.set(stream.size())
    return report


def _settle_batch(deliveries: list[Delivery], report: SettleReport) -> list[str]:
    """Settle a batch in order; returns the entry ids to acknowledge."""
    parsed: list[tuple[Delivery, UsageEntry | InvalidUsageEntry]] = []
    for delivery in deliveries:
        try:
            if delivery.payload is None:
                raise InvalidUsageEntry("no usage payload")
            parsed.append((delivery, UsageEntry.from_json(delivery.payload)))
        except InvalidUsageEntry as exc:
            parsed.append((delivery, exc))
    entries = [e for _, e in parsed if isinstance(e, UsageEntry)]
    try:
        known = _Known.load(entries)
    except _TRANSIENT_DB as exc:
        _interrupted(report, exc)
        return []
    except Exception:  # noqa: BLE001 - one entry's ids: each entry loads its own
        logger.warning("usage batch lookup failed; settling its entries one by one")
        known = None
    done: list[str] = []
    for delivery, entry in parsed:
        try:
            if isinstance(entry, InvalidUsageEntry):
                _set_aside(delivery, "", UsageDeadLetter.Reason.UNPARSEABLE, str(entry), report)
            else:
                _settle_entry(delivery, entry, known or _Known.load([entry]), report)
        except _TRANSIENT_DB as exc:
            _interrupted(report, exc)
            break
        except Exception as exc:  # noqa: BLE001 - never let one entry block the batch
            logger.exception("usage entry %s raised while settling", delivery.entry_id)
            response_id = entry.response_id if isinstance(entry, UsageEntry) else ""
            reason = UsageDeadLetter.Reason.ERROR
            _set_aside(delivery, response_id, reason, _describe(exc), report)
        done.append(delivery.entry_id)
    return done


def _interrupted(report: SettleReport, exc: Exception) -> None:
    report.interrupted = True
    logger.warning("usage settlement paused, the database is unavailable: %s", exc)


@dataclass(slots=True)
class _Known:
    """The rows a batch's entries name, read in one query each."""

    tenants: set[int]
    keys: set[int]
    users: set[int]
    prices: dict[int, Price]

    @classmethod
    def load(cls, entries: list[UsageEntry]) -> _Known:
        def ids(values) -> set[int]:
            return {v for v in values if v is not None}

        tenant_ids = ids(e.tenant_id for e in entries)
        key_ids = ids(e.tag.api_key_id for e in entries)
        user_ids = ids(e.tag.user_id for e in entries)
        price_ids = ids(e.tag.price_id for e in entries)
        # A savepoint: an id the database refuses (out of range) must not
        # break the transaction a dead-letter retry runs in.
        with transaction.atomic():
            return cls(
                tenants=set(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", flat=True)),
                keys=set(ApiKey.objects.filter(pk__in=key_ids).values_list("pk", flat=True)),
                users=set(
                    get_user_model().objects.filter(pk__in=user_ids).values_list("pk", flat=True)
                ),
                prices=Price.objects.in_bulk(price_ids),
            )


def _settle_entry(
    delivery: Delivery, entry: UsageEntry, known: _Known, report: SettleReport
) -> None:
    if entry.tenant_id not in known.tenants:
        reason = UsageDeadLetter.Reason.UNKNOWN_TENANT
        _set_aside(delivery, entry.response_id, reason, f"no tenant {entry.tenant_id}", report)
        return
    tag = entry.tag
    # A key or user deleted since (the foreign keys' SET_NULL).
    named = replace(
        tag,
        api_key_id=tag.api_key_id if tag.api_key_id in known.keys else None,
        user_id=tag.user_id if tag.user_id in known.users else None,
    )
    try:
        with transaction.atomic():
            created = usage_entry_record(entry=replace(entry, tag=named))
    except _POISON as exc:
        reason = UsageDeadLetter.Reason.INVALID
        _set_aside(delivery, entry.response_id, reason, _describe(exc), report)
        return
    if created:
        report.recorded += 1
        metrics.SETTLED.labels("recorded").inc()
    else:
        report.known += 1
        metrics.SETTLED.labels("known").inc()
    price = known.prices.get(tag.price_id) if tag.price_id is not None else None
    hold = BudgetHold(
        entry.response_id,
        tag.tier_id,
        tag.budget_account,
        rates=(
            Rates.of(price, service_tier=tag.service_tier).scaled(
                price_multiplier_for(source=tag.source)
            )
            if price is not None
            else None
        ),
    )
    period = tag.quota_period or datetime.fromtimestamp(entry.created_at, UTC).strftime("%Y%m")
    ticket = Ticket(
        entry.response_id,
        tag.api_key_id,
        entry.tenant_id,
        period,
        batch=tag.source == UsageRecord.Source.BATCH,
    )
    try:
        # After the record: until the hold turns into spend the response
        # counts as held, so it never counts nowhere.
        claims_settle(
            hold=hold,
            ticket=ticket,
            status=entry.status,
            prompt_tokens=entry.prompt_tokens,
            cached_tokens=entry.cached_tokens,
            completion_tokens=entry.completion_tokens,
        )
    except (RedisError, BusUnavailable):
        # The claims expire with their leases; budgets_check adds the
        # record's cost to the spend.
        logger.warning("claims of %s not settled: Redis unavailable", entry.response_id)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: {exc.message_dict if hasattr(exc, 'error_dict') else exc}"
    return f"{type(exc).__name__}: {exc}"


def _storable(text: str) -> str:
    return text.replace("\x00", "\ufffd")


def _set_aside(
    delivery: Delivery, response_id: str, reason: str, error: str, report: SettleReport
) -> None:
    # PostgreSQL text holds no NUL: a letter that cannot be stored would
    # block the batch like the entry it sets aside.
    payload = _storable(delivery.payload or "")
    # A redelivery of an entry set aside before its acknowledgement.
    if not UsageDeadLetter.objects.filter(entry_id=delivery.entry_id, payload=payload).exists():
        UsageDeadLetter.objects.create(
            entry_id=_storable(delivery.entry_id)[:64],
            response_id=_storable(response_id)[:64],
            reason=reason,
            error=_storable(error),
            payload=payload,
        )
    report.dead += 1
    metrics.DEAD_LETTERS.labels(reason).inc()
    logger.error(
        "usage entry %s (response %s) set aside: %s: %s",
        delivery.entry_id,
        response_id or "?",
        reason,
        error,
    )


def usage_dead_letter_retry(*, letter: UsageDeadLetter) -> bool:
    """Settle a set-aside entry again (its cause fixed); True when it settled.

    The letter is deleted when the entry settles; otherwise it stays and a
    new one records why it failed again.
    """
    report = SettleReport()
    delivery = Delivery(letter.entry_id, letter.payload or None)
    with transaction.atomic():
        letter.delete()
        done = _settle_batch([delivery], report)
    return bool(done) and report.dead == 0
