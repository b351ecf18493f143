"""Redis-specific behaviour: key layout, expiries and an unreachable server."""

from __future__ import annotations

import json
import time

import pytest
import redis

from tests.helpers import async_wait_until
from tests.wire.bus.buses import UNREACHABLE_REDIS_URL, needs_redis, redis_test_url, uid
from wire.bus import BusUnavailable
from wire.bus.redis_bus import (
    OPEN_STREAM_TTL,
    WORKERS_KEY,
    RedisBus,
    RedisWorkerBus,
    heartbeat_key,
    stream_key,
    terminal_key,
)
from wire.events import Created, EventType, Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerInfo, WorkerState


@pytest.fixture
def client():
    r = redis.Redis.from_url(redis_test_url(), decode_responses=True)
    yield r
    r.close()


@needs_redis
def test_event_entries_are_numbered_by_seq_and_expire(client):
    """Entry ids are 0-{seq}; open streams get a long TTL, finished ones the response TTL."""
    worker_bus = RedisWorkerBus(redis_test_url(), response_ttl=30)
    rid = uid("resp")
    worker_bus.publish(rid, Created(response_id=rid, model="m", worker_id="w", prompt_tokens=1))
    assert [entry_id for entry_id, _ in client.xrange(stream_key(rid))] == ["0-1"]
    assert 30 < client.ttl(stream_key(rid)) <= OPEN_STREAM_TTL
    assert not client.exists(terminal_key(rid))
    worker_bus.publish(rid, Terminal(EventType.COMPLETED, 2))
    assert 0 < client.ttl(stream_key(rid)) <= 30
    assert 0 < client.ttl(terminal_key(rid)) <= 30
    assert client.get(terminal_key(rid)) == "2"


@needs_redis
@pytest.mark.asyncio
async def test_publish_if_open_sets_the_terminal_key_and_ttl(client):
    """The web tier's terminal closes the stream like the worker's would."""
    bus = RedisBus(redis_test_url(), response_ttl=30)
    rid = uid("resp")
    assert await bus.publish_if_open(rid, Terminal(EventType.FAILED, 0))
    assert client.get(terminal_key(rid)) == "1"
    assert 0 < client.ttl(stream_key(rid)) <= 30
    await bus.close()


@needs_redis
@pytest.mark.asyncio
async def test_dead_workers_are_removed_from_the_registry_hash(client):
    """A worker whose heartbeat key expired (after its TTL) is deleted from
    llm:workers when listed."""
    bus = RedisBus(redis_test_url(), heartbeat_ttl=1)
    worker_bus = RedisWorkerBus(redis_test_url(), heartbeat_ttl=1)
    wid = uid("dead")
    registered = time.monotonic()
    worker_bus.register(WorkerInfo(worker_id=wid, model="m", state=WorkerState.READY))
    assert client.hexists(WORKERS_KEY, wid)
    assert 0 < client.pttl(heartbeat_key(wid)) <= 1000
    await async_wait_until(
        lambda: not client.exists(heartbeat_key(wid)), timeout=30, message="heartbeat key expiry"
    )
    assert time.monotonic() - registered >= 0.95  # the TTL, less the server clock's rounding
    assert wid not in {w.worker_id for w in await bus.list_workers()}
    assert not client.hexists(WORKERS_KEY, wid)
    await bus.close()


@needs_redis
@pytest.mark.asyncio
async def test_a_registry_record_with_an_unknown_field_still_routes(client):
    """A newer worker's heartbeat with a field this web process does not
    know neither hides that worker nor breaks listing the others."""
    bus = RedisBus(redis_test_url())
    worker_bus = RedisWorkerBus(redis_test_url())
    newer, plain = uid("newer"), uid("plain")
    worker_bus.register(WorkerInfo(worker_id=plain, model="m", state=WorkerState.READY))
    worker_bus.register(WorkerInfo(worker_id=newer, model="m", state=WorkerState.READY))
    record = json.loads(client.hget(WORKERS_KEY, newer)) | {"numa_node": 1}
    client.hset(WORKERS_KEY, newer, json.dumps(record))
    listed = {w.worker_id for w in await bus.list_workers()}
    assert {newer, plain} <= listed
    await bus.close()


@pytest.mark.asyncio
async def test_unreachable_redis_raises_bus_unavailable_on_the_web_side():
    """Every web-side call maps a refused connection to BusUnavailable (503)."""
    bus = RedisBus(UNREACHABLE_REDIS_URL)
    request = GenerationRequest(
        response_id="r", model="m", prompt_token_ids=[1], sampling=Sampling()
    )
    calls = [
        bus.submit("w", request),
        bus.read_events("r", 0, 100),
        bus.publish_if_open("r", Terminal(EventType.FAILED, 0)),
        bus.request_abort("w", "r"),
        bus.list_workers(),
        bus.worker_alive("w"),
    ]
    for call in calls:
        with pytest.raises(BusUnavailable):
            await call
    await bus.close()


def test_unreachable_redis_raises_bus_unavailable_on_the_worker_side():
    """The worker loop sees BusUnavailable too, and can retry."""
    worker_bus = RedisWorkerBus(UNREACHABLE_REDIS_URL)
    info = WorkerInfo(worker_id="w", model="m", state=WorkerState.READY)
    with pytest.raises(BusUnavailable):
        worker_bus.register(info)
    with pytest.raises(BusUnavailable):
        worker_bus.heartbeat(info)
    with pytest.raises(BusUnavailable):
        worker_bus.poll("w", 100)
    with pytest.raises(BusUnavailable):
        worker_bus.publish_many([("r", Terminal(EventType.FAILED, 1))])
