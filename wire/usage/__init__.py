"""The usage stream: each billed response's terminal usage, from the worker.

``get_usage_stream()`` is where this process appends or settles: Redis
(``llm:usage``) when the bus is on Redis, else one process-wide in-memory
stream (embedded mode: the embedded worker and the in-process settler share
it). Schema in ``entry``, consumer-group interface in ``base``.
"""

from __future__ import annotations

import threading

from wire.usage.base import CLAIM_IDLE_MS, GROUP, STREAM_KEY, Delivery, UsageStream
from wire.usage.entry import (
    InvalidUsageEntry,
    UsageEntry,
    UsageTag,
    usage_entry,
)
from wire.usage.memory_stream import MemoryUsageStream

__all__ = [
    "CLAIM_IDLE_MS",
    "GROUP",
    "STREAM_KEY",
    "Delivery",
    "InvalidUsageEntry",
    "MemoryUsageStream",
    "UsageEntry",
    "UsageStream",
    "UsageTag",
    "get_usage_stream",
    "reset_usage_streams",
    "usage_entry",
]

_lock = threading.Lock()
_memory: MemoryUsageStream | None = None
# One sync client per Redis URL and key; redis-py's sync clients are thread-safe.
_redis: dict[tuple[str, str], UsageStream] = {}


def get_usage_stream() -> UsageStream:
    """The usage stream of the bus this process is configured with."""
    # Imported here: wire.requests imports this package, and the bus imports it.
    from wire.bus import bus_config

    global _memory
    config = bus_config()
    url, key = config.redis_url, config.usage_stream_key
    with _lock:
        if not url:
            if _memory is None:
                _memory = MemoryUsageStream()
            return _memory
        stream = _redis.get((url, key))
        if stream is None:
            from wire.usage.redis_stream import RedisUsageStream

            stream = _redis[(url, key)] = RedisUsageStream(url, key=key)
        return stream


def reset_usage_streams() -> None:
    """Forget the process's streams (tests; the in-memory entries go with it)."""
    global _memory
    with _lock:
        _memory = None
        _redis.clear()
