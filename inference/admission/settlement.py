"""The end of a response: its one usage record, then its claims settled.

``response_settle`` is what the relay calls at every ending (completed,
failed, cancelled, client gone), a plain call. It builds the response's
``UsageEntry`` (``wire.usage``: the one usage record type, as the worker
builds its own) and hands it to billing's settler, the one writer of
UsageRecords. With PostgreSQL down the entry goes to the usage stream
instead, where the settler finds it once the database is back (the
worker's own entry may be there too: the record is unique per response).
Then the budget hold and the rate-limit reservation settle to what the
record bills (``limits_settle``). Each step is idempotent per response id.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.db import DatabaseError

from billing.services import usage_entry_record
from fleet.fallback import DB_UNREACHABLE, db_mark_down, db_marked_down
from inference.admission.limits import Admission, limits_settle
from wire.events import Terminal, TokenUsage
from wire.usage import UsageEntry, UsageTag, get_usage_stream, usage_entry

if TYPE_CHECKING:
    from inference.relay.tap import ResponseRoute


@dataclass(slots=True, frozen=True)
class Settlement:
    """What a response's end settles, as its admission left it."""

    admission: Admission
    # Who the record names and what it is billed at (the worker's usage
    # entry carries the same tag).
    tag: UsageTag
    # When the request was enqueued (unix seconds): the record's date,
    # whoever writes it.
    created_at: float


def usage_tag(
    admission: Admission,
    *,
    api_key_id: int | None,
    user_id: int | None,
    source: str,
    regenerated: bool,
) -> UsageTag:
    """What a usage entry must carry for billing to settle it alone."""
    hold = admission.hold
    return UsageTag(
        api_key_id=api_key_id,
        user_id=user_id,
        source=source,
        regenerated=regenerated,
        tier_id=hold.tier_id,
        price_id=hold.price_id,
        budget_account=hold.account,
        quota_period=admission.ticket.period,
    )


async def response_settle(
    *, settlement: Settlement, route: ResponseRoute, terminal: Terminal, usage: TokenUsage
) -> None:
    """Record the response's usage, then settle its claims (see the module)."""
    entry = usage_entry(
        response_id=route.response_id,
        tenant_id=route.tenant_id,
        model=route.model,
        tag=settlement.tag,
        terminal=terminal,
        usage=usage,
        created_at=settlement.created_at,
        finished_at=time.time(),
        worker_id=route.worker_id,
        model_version=route.model_version,
    )
    try:
        await _record(entry)
    finally:
        # After the record: until its hold turns into spend, the response
        # counts as held, so it never counts nowhere.
        await limits_settle(settlement.admission, entry)


async def _record(entry: UsageEntry) -> None:
    try:
        if db_marked_down():
            raise DatabaseError("database marked down")
        await sync_to_async(usage_entry_record)(entry=entry)
    except DatabaseError as exc:
        # Any refusal goes to the stream (the settler retries or dead-letters
        # it); only an unreachable database trips the breaker for everyone.
        if isinstance(exc, DB_UNREACHABLE):
            db_mark_down()
        stream = get_usage_stream()
        await sync_to_async(stream.append, thread_sensitive=False)([entry])
