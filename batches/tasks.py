"""Celery tasks of the Batch API (queue ``batches``): validate, feed, finalize, sweep.

Each task calls one service and enqueues what comes next; all are
idempotent (a redelivered task finds the work done or resumes it). Without
a Celery worker (embedded mode, ``BATCHES_IN_PROCESS``) ``enqueue`` runs
them in threads of this process instead.
"""

from __future__ import annotations

import logging
import threading

from celery import shared_task
from django.conf import settings
from django.db import connections

from batches.services import batches as batch_services
from batches.services import execution
from batches.services.execution import Next

logger = logging.getLogger(__name__)

# A finalize that must wait for a feeder's lines in flight looks again after this.
FINALIZE_RETRY_SECONDS = 1.0
# A round that found no room (the tenant's other batches hold its slots).
FEED_RETRY_SECONDS = 1.0
# The beat's schedule of batches_sweep (config/settings/base.py), in-process too.
SWEEP_SECONDS = 60.0


def enqueue(task, batch_id: str, *, countdown: float = 0) -> None:
    """Run ``task`` for ``batch_id`` on the batches queue (or in a thread)."""
    if settings.BATCHES_IN_PROCESS:
        timer = threading.Timer(countdown, _run_here, args=(task, batch_id))
        timer.daemon = True
        timer.start()
    else:
        task.apply_async((batch_id,), countdown=countdown or None)


def _run_here(task, batch_id: str) -> None:
    try:
        task.apply(args=(batch_id,), throw=False)
    finally:
        connections.close_all()


@shared_task
def batch_validate(batch_id: str) -> None:
    batch_services.batch_validate(batch_id=batch_id)


@shared_task
def batch_feed(batch_id: str) -> str:
    next_step = execution.batch_feed(batch_id=batch_id)
    _follow(batch_id, next_step)
    return next_step.value


@shared_task
def batch_finalize(batch_id: str) -> bool:
    done = execution.batch_finalize(batch_id=batch_id)
    if not done:
        enqueue(batch_finalize, batch_id, countdown=FINALIZE_RETRY_SECONDS)
    return done


@shared_task
def batches_sweep() -> int:
    """The beat's safety net: expiry, and batches whose task was lost."""
    work = execution.batches_sweep()
    for batch_id, next_step in work:
        _follow(batch_id, next_step)
    return len(work)


_sweeper: threading.Thread | None = None
_sweeper_lock = threading.Lock()


def sweeper_start() -> threading.Thread:
    """Without Celery beat (``BATCHES_IN_PROCESS``): the sweep in a daemon
    thread every SWEEP_SECONDS, so batches resume after a restart and expire."""
    global _sweeper
    with _sweeper_lock:
        if _sweeper is None or not _sweeper.is_alive():
            _sweeper = threading.Thread(target=_sweep_forever, name="batches-sweep", daemon=True)
            _sweeper.start()
        return _sweeper


def _sweep_forever() -> None:
    stop = threading.Event()
    while not stop.wait(SWEEP_SECONDS):
        try:
            batches_sweep.apply(throw=True)
        except Exception:
            # Tried again next time; nothing is lost in between.
            logger.exception("batch sweep failed")
        finally:
            connections.close_all()


def _follow(batch_id: str, next_step: Next) -> None:
    if next_step == Next.FEED:
        enqueue(batch_feed, batch_id, countdown=FEED_RETRY_SECONDS)
    elif next_step == Next.FINALIZE:
        enqueue(batch_finalize, batch_id)
