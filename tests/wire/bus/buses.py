"""Both bus implementations, for tests that run the same cases over each.

Redis tests use $REDIS_URL (the test run sets its own database, e.g.
redis://127.0.0.1:6379/2) or that default. Every test uses fresh uuids for
worker and response ids, so nothing is flushed and parallel runs on the same
database cannot disturb each other.
"""

from __future__ import annotations

import uuid

import pytest

from tests.redis_helpers import redis_test_url as shared_redis_test_url
from tests.redis_helpers import redis_up
from wire.bus.memory_bus import MemoryBus
from wire.bus.redis_bus import RedisBus, RedisWorkerBus

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/2"
# Nothing listens here: connection refused at once.
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:6390/0"


def redis_test_url() -> str:
    return shared_redis_test_url(DEFAULT_REDIS_URL)


def _redis_up() -> bool:
    return redis_up(redis_test_url())


REDIS_UP = _redis_up()
needs_redis = pytest.mark.skipif(not REDIS_UP, reason="Redis is not reachable")
BUS_KINDS = [pytest.param("memory"), pytest.param("redis", marks=needs_redis)]


def make_buses(kind: str, *, response_ttl: int = 600, heartbeat_ttl: int = 6):
    """``(web_bus, worker_bus)`` of ``kind``; for memory both are one object."""
    if kind == "memory":
        bus = MemoryBus(response_ttl=response_ttl, heartbeat_ttl=heartbeat_ttl)
        return bus, bus
    url = redis_test_url()
    ttls = {"response_ttl": response_ttl, "heartbeat_ttl": heartbeat_ttl}
    return RedisBus(url, **ttls), RedisWorkerBus(url, **ttls)


def uid(label: str) -> str:
    return f"test-{label}-{uuid.uuid4().hex[:10]}"
