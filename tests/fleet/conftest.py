"""Fleet fixtures: a private snapshot key per test (the worker loops are
tests/plugins/engine.py's).

Every test publishes to its own ``FLEET_SNAPSHOT_KEY`` and starts with an
empty in-process reader, so snapshots never leak between tests (or into
other apps' tests sharing the Redis database).
"""

from __future__ import annotations

import uuid

import pytest

from fleet.snapshot import snapshot_reset


@pytest.fixture(autouse=True)
def fleet_snapshot_key(settings):
    settings.FLEET_SNAPSHOT_KEY = f"test-fleet-{uuid.uuid4().hex[:10]}:snapshot"
    settings.FLEET_SNAPSHOT_REFRESH = 0.0
    snapshot_reset()
    keys = [settings.FLEET_SNAPSHOT_KEY, settings.FLEET_SNAPSHOT_KEY + ":seq"]
    url = settings.REDIS_URL  # a test may point settings elsewhere
    yield settings.FLEET_SNAPSHOT_KEY
    snapshot_reset()
    if url:
        import redis

        redis.Redis.from_url(url).delete(*keys)
