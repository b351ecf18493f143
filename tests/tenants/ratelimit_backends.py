"""Both limiters, for tests that run the same cases over each.

Redis limiters get a fresh key prefix per test, so nothing is flushed and
parallel runs on the same Redis database cannot disturb each other.
"""

from __future__ import annotations

import uuid

import pytest

from tenants.ratelimit import Limits, Ticket
from tenants.ratelimit.base import WINDOW_MS
from tenants.ratelimit.memory_limiter import MemoryLimiter
from tenants.ratelimit.redis_limiter import RedisLimiter
from tests.redis_helpers import redis_test_url as shared_redis_test_url
from tests.redis_helpers import redis_up

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/5"


def redis_test_url() -> str:
    return shared_redis_test_url(DEFAULT_REDIS_URL)


def _redis_up() -> bool:
    return redis_up(redis_test_url())


needs_redis = pytest.mark.skipif(not _redis_up(), reason="Redis is not reachable")
KINDS = [pytest.param("memory"), pytest.param("redis", marks=needs_redis)]


def make_limiter(kind: str, *, lease_ms: int = 900_000, window_ms: int = WINDOW_MS):
    if kind == "memory":
        return MemoryLimiter(lease_ms=lease_ms, window_ms=window_ms)
    prefix = f"rltest-{uuid.uuid4().hex[:12]}"
    return RedisLimiter(redis_test_url(), prefix=prefix, lease_ms=lease_ms, window_ms=window_ms)


def limits(**overrides: int) -> Limits:
    values = dict(
        key_rpm=1000,
        key_tpm=1_000_000,
        tenant_rpm=1000,
        tenant_tpm=1_000_000,
        max_concurrent=1000,
        monthly_quota=10**12,
    )
    values.update(overrides)
    return Limits(**values)


def ticket(api_key_id: int = 1, tenant_id: int = 1) -> Ticket:
    return Ticket.for_response(
        response_id=f"chatcmpl-{uuid.uuid4().hex}", api_key_id=api_key_id, tenant_id=tenant_id
    )
