"""Celery tasks of the fleet queue: thin wrappers around fleet.services."""

from __future__ import annotations

from celery import shared_task

from fleet import services
from fleet.models import Rollout


@shared_task(name="fleet.tasks.snapshot_publish")
def snapshot_publish() -> int:
    return services.snapshot_publish()


@shared_task(name="fleet.tasks.rollout_begin")
def rollout_begin(**options) -> int:
    """Start a rollout (``services.rollout_start`` options) and schedule its steps."""
    rollout = services.rollout_start(**options)
    rollout_step.apply_async((rollout.pk, 0), countdown=rollout.dwell_seconds)
    return rollout.pk


@shared_task(name="fleet.tasks.rollout_step")
def rollout_step(rollout_id: int, judged: int | None = None) -> str:
    """Judge the current step after its dwell time; schedule the next one.

    ``judged`` (the judgements so far when scheduled) makes a redelivery a
    no-op: only the delivery that judged schedules the next step.
    """
    before = judged
    rollout = services.rollout_advance(rollout_id=rollout_id, judged=judged)
    moved = before is None or len(rollout.results) == before + 1
    if rollout.state == Rollout.State.RAMPING and moved:
        rollout_step.apply_async(
            (rollout_id, len(rollout.results)), countdown=rollout.dwell_seconds
        )
    return rollout.state


@shared_task(name="fleet.tasks.shadow_purge")
def shadow_purge() -> int:
    return services.shadow_comparison_purge()


@shared_task(name="fleet.tasks.standby_retire")
def standby_retire() -> list[str]:
    return services.standby_retire()
