"""Readiness of a web process: can it serve a chat completion right now?

Three checks, each reported by name so an operator sees which one failed:

- ``database``: PostgreSQL answers ``SELECT 1``; while it does not, the
  process still serves if it holds a control snapshot (``fleet.fallback``:
  keys from the auth cache, usage to the usage stream), reported as ``fallback``.
- ``redis``: the bus answers (embedded mode has no Redis: ``embedded``).
- ``workers``: every served model has at least one READY worker. Served
  models are the control snapshot's catalog, else the active rows.
- ``draining``: present (true) once the process is shutting down
  (``inference.admission.drain``): not ready, whatever the others say.

Liveness (``/healthz``) checks nothing: a process that can answer is alive.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connection

from fleet.fallback import DB_UNREACHABLE, db_mark_down, db_marked_down
from fleet.selectors import served_model_list_active
from fleet.snapshot import asnapshot_current
from inference.admission.drain import draining
from wire.bus import BusUnavailable, get_bus
from wire.workers import WorkerState

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Readiness:
    ready: bool
    checks: dict[str, Any] = field(default_factory=dict)


async def readiness() -> Readiness:
    """Run the checks; ready only if all of them pass."""
    snapshot = await asnapshot_current()
    database = await _database()
    if database == "down" and snapshot is not None:
        database = "fallback"
    redis, workers = await _bus()
    models = await _served_models(snapshot, database)
    ready_by_model = {
        name: sum(1 for w in workers if w.model == name and w.state == WorkerState.READY)
        for name in models
    }
    checks = {
        "database": database,
        "redis": redis,
        "workers": ready_by_model,
    }
    if draining():
        checks["draining"] = True
    ready = (
        not draining()
        and database in ("ok", "fallback")
        and redis in ("ok", "embedded")
        and bool(models)
        and all(ready_by_model.values())
    )
    return Readiness(ready, checks)


async def _database() -> str:
    if db_marked_down():
        return "down"
    try:
        await sync_to_async(_select_one)()
    except DatabaseError as exc:
        if isinstance(exc, DB_UNREACHABLE):
            db_mark_down()
        return "down"
    return "ok"


def _select_one() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


async def _bus() -> tuple[str, list]:
    try:
        workers = await get_bus().list_workers()
    except BusUnavailable:
        return "down", []
    return ("ok" if settings.REDIS_URL else "embedded"), workers


async def _served_models(snapshot, database: str) -> list[str]:
    if snapshot is not None and snapshot.models:
        return sorted(snapshot.models)
    if database != "ok":
        return []
    try:
        return await sync_to_async(_active_model_names)()
    except DatabaseError:
        return []


def _active_model_names() -> list[str]:
    return [m.name for m in served_model_list_active()]
