"""Shadow traffic: a share of stable requests also runs on the canary.

The copy is an ordinary ``GenerationRequest`` with its own response id on
a canary replica; nobody relays its events and no usage is recorded for
it. When both streams have ended, their texts and token counts are stored
as a ``ShadowComparison`` for offline review: quality regressions do not
show up in latency or error metrics. Only tenants that opted in
(``Tenant.shadow_opt_in``) are shadowed, and comparisons are deleted after
``SHADOW_RETENTION_DAYS`` (``shadow_comparison_purge``, on the beat).
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from fleet.ring import HashRing
from fleet.router import servable
from wire.bus import Bus, BusUnavailable
from wire.events import Delta, Terminal
from wire.requests import GenerationRequest
from wire.snapshot import RolloutSpec
from wire.workers import WorkerInfo

logger = logging.getLogger(__name__)

# A shadow pair not finished by then is dropped (the comparison is optional).
SHADOW_TIMEOUT_SECONDS = 600.0
# Strong references: a bare create_task may be garbage collected mid-flight.
_pending: set[asyncio.Task] = set()


async def shadow_maybe(
    *,
    bus: Bus,
    registry: list[WorkerInfo],
    request: GenerationRequest,
    rollout: RolloutSpec,
    stable_worker: WorkerInfo,
    routing_key: str,
    note_sent: Callable[[WorkerInfo, int], None],
    sample: Callable[[], float] = random.random,
) -> GenerationRequest | None:
    """Send a copy of ``request`` to a canary replica for ``shadow_share`` of calls."""
    if sample() >= rollout.shadow_share:
        return None
    canaries = {
        w.worker_id: w
        for w in servable(registry, request.model)
        if w.version == rollout.canary_version
    }
    if not canaries:
        return None
    worker = canaries[HashRing(canaries).get(routing_key)]
    shadow = GenerationRequest(
        response_id=f"shadow-{uuid.uuid4().hex}",
        model=request.model,
        prompt_token_ids=list(request.prompt_token_ids),
        sampling=request.sampling,
        # The lowest priority: shadow work yields to every user request.
        priority=0,
        tier="free",
        tenant_id=request.tenant_id,
        cache_salt=request.cache_salt,
    )
    try:
        await bus.submit(worker.worker_id, shadow)
    except BusUnavailable:
        return None
    note_sent(worker, len(shadow.prompt_token_ids))
    task = asyncio.create_task(
        _compare(bus, request, shadow, rollout, stable_worker.version, worker.version)
    )
    _pending.add(task)
    task.add_done_callback(_pending.discard)
    return shadow


async def _outcome(bus: Bus, response_id: str) -> tuple[str, str, int]:
    """(terminal type, text of choice 0, completion tokens) of one stream."""
    parts: list[str] = []
    seq = 0
    while True:
        for event in await bus.read_events(response_id, seq, 1000):
            seq = event.seq
            if isinstance(event, Delta):
                parts.extend(c.text for c in event.choices if c.index == 0)
            elif isinstance(event, Terminal):
                return event.type.value, "".join(parts), event.usage.completion_tokens


async def _compare(
    bus: Bus,
    request: GenerationRequest,
    shadow: GenerationRequest,
    rollout: RolloutSpec,
    stable_version: str,
    canary_version: str,
) -> None:
    try:
        stable, canary = await asyncio.wait_for(
            asyncio.gather(_outcome(bus, request.response_id), _outcome(bus, shadow.response_id)),
            SHADOW_TIMEOUT_SECONDS,
        )
    except (TimeoutError, BusUnavailable):
        logger.info("shadow pair %s abandoned", request.response_id)
        return
    from fleet.services import shadow_comparison_record

    fields: dict[str, Any] = {
        "rollout_id": rollout.id,
        "tenant_id": request.tenant_id,
        "response_id": request.response_id,
        "shadow_response_id": shadow.response_id,
        "prompt_tokens": len(request.prompt_token_ids),
        "stable_version": stable_version,
        "canary_version": canary_version,
        "stable": stable,
        "canary": canary,
    }
    try:
        await sync_to_async(shadow_comparison_record)(**fields)
    except Exception:
        # The database may be down; a lost comparison costs nothing served.
        logger.warning("could not store shadow pair %s", request.response_id, exc_info=True)
