"""The web <-> worker bus, chosen by settings.REDIS_URL.

``get_bus()`` is the web tier's async side, ``get_worker_bus()`` the worker
loop's sync side. Without REDIS_URL both are the same process-wide
``MemoryBus`` (embedded mode).
"""

from __future__ import annotations

import asyncio
import threading
import weakref

from inference.bus.base import (
    TERMINAL_EVENTS,
    Bus,
    BusUnavailable,
    EventType,
    GenerationRequest,
    WorkerBus,
    WorkerInfo,
    WorkerState,
)
from inference.bus.memory_bus import MemoryBus

__all__ = [
    "TERMINAL_EVENTS",
    "Bus",
    "BusUnavailable",
    "EventType",
    "GenerationRequest",
    "MemoryBus",
    "WorkerBus",
    "WorkerInfo",
    "WorkerState",
    "get_bus",
    "get_worker_bus",
    "reset_buses",
]

_lock = threading.Lock()
_memory_bus: MemoryBus | None = None
# redis.asyncio clients belong to the loop that created them: one per loop.
_redis_buses: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_redis_worker_bus = None


def _ttls() -> dict[str, int]:
    from django.conf import settings

    return {
        "response_ttl": settings.RESPONSE_STREAM_TTL,
        "heartbeat_ttl": settings.WORKER_HEARTBEAT_TTL,
    }


def _redis_url() -> str | None:
    from django.conf import settings

    return settings.REDIS_URL


def memory_bus() -> MemoryBus:
    """The process-wide in-process bus (both sides)."""
    global _memory_bus
    with _lock:
        if _memory_bus is None:
            _memory_bus = MemoryBus(**_ttls())
        return _memory_bus


def get_bus() -> Bus:
    """The web side of the bus for the running event loop."""
    url = _redis_url()
    if not url:
        return memory_bus()
    from inference.bus.redis_bus import RedisBus

    loop = asyncio.get_running_loop()
    with _lock:
        bus = _redis_buses.get(loop)
        if bus is None:
            bus = _redis_buses[loop] = RedisBus(url, **_ttls())
        return bus


def get_worker_bus() -> WorkerBus:
    """The worker side of the bus (sync, shared by the worker's threads)."""
    global _redis_worker_bus
    url = _redis_url()
    if not url:
        return memory_bus()
    from inference.bus.redis_bus import RedisWorkerBus

    with _lock:
        if _redis_worker_bus is None:
            _redis_worker_bus = RedisWorkerBus(url, **_ttls())
        return _redis_worker_bus


def reset_buses() -> None:
    """Forget cached buses (tests that switch REDIS_URL or TTLs call this).

    The memory bus stays while an embedded worker serves from it: a new one
    would be a bus no worker listens on.
    """
    global _memory_bus, _redis_worker_bus
    from gpuworkers import embedded

    with _lock:
        if embedded.current() is None:
            _memory_bus = None
        _redis_worker_bus = None
        _redis_buses.clear()
