"""GPU accounting: turn workers' cumulative busy/idle counters into samples."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils import timezone

from billing.models import GpuUsageSample, WorkerMeter
from wire.workers import WorkerInfo

logger = logging.getLogger(__name__)


def _hourly_price(info: WorkerInfo) -> Decimal:
    try:
        price = Decimal(str(info.extra.get("hourly_price", "0")))
    except InvalidOperation:
        price = Decimal(-1)
    if not price.is_finite() or price < 0:
        logger.warning("worker %s reports an invalid hourly price", info.worker_id)
        return Decimal(0)
    return price


def gpu_usage_sample(*, workers: list[WorkerInfo], now: datetime | None = None) -> int:
    """Record each worker's busy and idle seconds since its last sample; returns samples made.

    The workers' counters are cumulative per process (``boot_id``), so a
    sample is the difference to the last one recorded for that process: a
    rerun with the same heartbeats records nothing, and two concurrent runs
    serialize on the meter row. A restarted worker (new boot_id) starts a
    new meter at zero. Workers reporting no counters are skipped.
    """
    now = now or timezone.now()
    created = 0
    for info in workers:
        boot_id = info.extra.get("boot_id")
        if not boot_id or "busy_seconds" not in info.extra:
            continue
        busy = float(info.extra["busy_seconds"])
        idle = float(info.extra.get("idle_seconds", 0.0))
        with transaction.atomic():
            meter, _ = WorkerMeter.objects.select_for_update().get_or_create(
                worker_id=info.worker_id, boot_id=boot_id, defaults={"model": info.model}
            )
            delta_busy, delta_idle = busy - meter.busy_seconds, idle - meter.idle_seconds
            if delta_busy < 0 or delta_idle < 0:
                # An older heartbeat than the one already sampled (a delayed
                # task): those seconds are counted already.
                continue
            if delta_busy == 0 and delta_idle == 0:
                continue
            _, made = GpuUsageSample.objects.get_or_create(
                worker_id=info.worker_id,
                boot_id=boot_id,
                busy_total=busy,
                idle_total=idle,
                defaults={
                    "model": info.model,
                    "model_version": info.version,
                    "day": now.astimezone(UTC).date(),
                    "sampled_at": now,
                    "busy_seconds": delta_busy,
                    "idle_seconds": delta_idle,
                    "hourly_price": _hourly_price(info),
                },
            )
            meter.busy_seconds, meter.idle_seconds = busy, idle
            meter.save(update_fields=["busy_seconds", "idle_seconds", "updated_at"])
            created += made
    return created
