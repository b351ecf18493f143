"""How many of a batch's lines to keep in flight: enough to fill the
engines that serve them, no more.

A line in flight runs in an engine or waits in its queue. Too few and the
engine runs narrower than it could, and drains whenever lines that started
together finish together, until the feeder has recorded them and handed it
new ones (each through the whole request path). Too many and lines wait in
the engine's queue holding budget holds and streams for nothing. So the
bound follows the fleet: the seats (``max_num_seqs``) of the ready workers
serving the batch's models, plus ``QUEUED_SHARE`` of them waiting behind,
so that lines finishing are replaced from the engine's own queue (in the
same step) while the feeder refills it. Never above the settings' caps
(``BATCH_MAX_IN_FLIGHT_PER_BATCH``, ``_PER_TENANT``, applied at the claim),
and the caps alone when no worker says how many seats it has. Batch lines
in an engine's queue never delay interactive requests: the engine starts
them only when no interactive request is queued (engine/scheduling/fair_policy.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from inference.relay.dispatch import BusUnavailable, get_bus
from wire.workers import WorkerInfo, WorkerState

logger = logging.getLogger(__name__)

# Lines queued in the engines behind the running ones, as a share of their
# seats: the lines that finish while the feeder records the last ones and
# starts new ones (a fraction of a line's generation time).
QUEUED_SHARE = 0.5


def in_flight_target(workers: Iterable[WorkerInfo], models: Iterable[str], cap: int) -> int:
    """Lines of a batch naming ``models`` to keep in flight on ``workers``."""
    names = set(models)
    seats = sum(
        int((worker.extra or {}).get("max_num_seqs") or 0)
        for worker in workers
        if worker.state == WorkerState.READY and worker.model in names
    )
    if seats <= 0:
        return cap
    return max(1, min(cap, math.ceil(seats * (1 + QUEUED_SHARE))))


async def in_flight_target_now(models: Iterable[str], cap: int) -> int:
    """``in_flight_target`` over the registry's workers now (the cap when
    the bus cannot say)."""
    try:
        workers = await get_bus().list_workers()
    except BusUnavailable:
        logger.warning("batch pacing: the worker registry is unreachable; using the cap")
        return cap
    return in_flight_target(workers, models, cap)
