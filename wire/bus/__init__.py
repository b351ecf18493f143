"""The bus: its interface, and the process's connections to it.

``get_bus()`` is the web tier's async side, ``get_worker_bus()`` the worker
loop's sync side. Without a Redis URL both are the same process-wide
``MemoryBus`` (embedded mode).

Where the bus lives is the process's business, not this package's: the
process configures it once with ``configure(provider)``, a callable that
returns the current ``BusConfig``. It is called on every lookup (cheaply),
so a Django process can hand in a provider that reads its settings and
tests that change those settings are followed.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from wire.bus.base import Bus, BusUnavailable, WorkerBus, iterate_events
from wire.bus.memory_bus import MemoryBus

__all__ = [
    "Bus",
    "BusConfig",
    "BusNotConfigured",
    "BusUnavailable",
    "MemoryBus",
    "WorkerBus",
    "bus_config",
    "configure",
    "get_bus",
    "get_worker_bus",
    "iterate_events",
    "memory_bus",
    "reset_buses",
]


@dataclass(slots=True, frozen=True)
class BusConfig:
    """Where the bus is and how long its keys live."""

    # None: the in-process bus (embedded mode).
    redis_url: str | None
    # Seconds a finished response's events stay readable (resume window).
    response_ttl: int = 600
    # Seconds after the last heartbeat at which a worker counts as dead.
    heartbeat_ttl: int = 6
    # The usage stream's key on that Redis (wire.usage).
    usage_stream_key: str = "llm:usage"


class BusNotConfigured(RuntimeError):
    """No process set-up called ``configure`` before the bus was used."""


_lock = threading.Lock()
_provider: Callable[[], BusConfig] | None = None
_memory_bus: MemoryBus | None = None
# Set while a worker serves from the memory bus: a new one would be a bus
# that no worker listens on.
_memory_bus_pinned = False
# redis.asyncio clients belong to the loop that created them: one per loop.
_redis_buses: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_redis_worker_bus = None


def configure(provider: Callable[[], BusConfig]) -> None:
    """Tell this process where its bus is (once, at start-up)."""
    global _provider
    _provider = provider


def _config() -> BusConfig:
    if _provider is None:
        raise BusNotConfigured("wire.bus.configure() was not called in this process")
    return _provider()


def bus_config() -> BusConfig:
    """Where this process's bus is (the usage stream lives beside it)."""
    return _config()


def memory_bus(*, pin: bool = False) -> MemoryBus:
    """The process-wide in-process bus (both sides).

    ``pin=True`` (the embedded worker) keeps it across ``reset_buses``.
    """
    global _memory_bus, _memory_bus_pinned
    config = _config()
    with _lock:
        if _memory_bus is None:
            _memory_bus = MemoryBus(
                response_ttl=config.response_ttl, heartbeat_ttl=config.heartbeat_ttl
            )
        _memory_bus_pinned = _memory_bus_pinned or pin
        return _memory_bus


def get_bus() -> Bus:
    """The web side of the bus for the running event loop."""
    config = _config()
    if not config.redis_url:
        return memory_bus()
    from wire.bus.redis_bus import RedisBus

    loop = asyncio.get_running_loop()
    with _lock:
        bus = _redis_buses.get(loop)
        if bus is None:
            bus = _redis_buses[loop] = RedisBus(
                config.redis_url,
                response_ttl=config.response_ttl,
                heartbeat_ttl=config.heartbeat_ttl,
            )
        return bus


def get_worker_bus() -> WorkerBus:
    """The worker side of the bus (sync, shared by the worker's threads)."""
    global _redis_worker_bus
    config = _config()
    if not config.redis_url:
        return memory_bus()
    from wire.bus.redis_bus import RedisWorkerBus

    with _lock:
        if _redis_worker_bus is None:
            _redis_worker_bus = RedisWorkerBus(
                config.redis_url,
                response_ttl=config.response_ttl,
                heartbeat_ttl=config.heartbeat_ttl,
            )
        return _redis_worker_bus


def reset_buses() -> None:
    """Forget cached buses (tests that switch the Redis URL or TTLs call this).

    A pinned memory bus stays (see ``memory_bus``).
    """
    global _memory_bus, _redis_worker_bus
    with _lock:
        if not _memory_bus_pinned:
            _memory_bus = None
        _redis_worker_bus = None
        _redis_buses.clear()
