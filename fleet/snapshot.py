"""This web process's view of the control snapshot, bound to its settings.

The schema, validation, stores and reader are the wire contract
(``wire.snapshot``), shared with the workers. Here they are bound to
settings: the store is Redis at ``REDIS_URL`` (this process's memory
without it) under ``FLEET_SNAPSHOT_KEY``, refreshed every
``FLEET_SNAPSHOT_REFRESH`` seconds. ``fleet.services.snapshot_publish``
writes; the router, admission and dispatch read ``snapshot_current()``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from wire.snapshot import (
    Snapshot,
    SnapshotReader,
    SnapshotStore,
    snapshot_store_for,
    snapshot_write,
)


def _store() -> SnapshotStore:
    return snapshot_store_for(settings.REDIS_URL, settings.FLEET_SNAPSHOT_KEY)


_reader = SnapshotReader(_store, refresh=lambda: settings.FLEET_SNAPSHOT_REFRESH)


def snapshot_store(document: dict[str, Any]) -> bool:
    """Store a validated document unless a newer version is already there."""
    return snapshot_write(_store(), document)


def snapshot_next_version() -> int:
    return _store().next_version()


def snapshot_store_raw(payload: str, version: int) -> None:
    """Write a document as is, bypassing validation (operators' tools, tests)."""
    _store().store_raw(version, payload)


def snapshot_current(*, max_age: float | None = None) -> Snapshot | None:
    """The last valid snapshot, refreshed from the store when older than ``max_age``.

    None only when no valid snapshot was ever seen by this process.
    """
    return _reader.current(max_age=max_age)


async def asnapshot_current() -> Snapshot | None:
    """``snapshot_current`` for async callers: the store is read off the loop."""
    return await _reader.acurrent()


def snapshot_reader_status() -> dict[str, Any]:
    return _reader.status()


def snapshot_reset() -> None:
    """Forget the in-process copy (tests that switch stores)."""
    _reader.reset()
