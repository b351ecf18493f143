"""The web tier's side of the Redis bus (async, one client per event loop)."""

from __future__ import annotations

import contextlib
import uuid

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from wire.bus.redis_bus.common import (
    INBOX_TTL,
    MAX_BLOCK_MS,
    MAX_CONNECTIONS,
    POOL_WAIT,
    PUBLISH_IF_OPEN_LUA,
    SOCKET_TIMEOUT,
    WORKERS_KEY,
    _decode_events,
    abort_key,
    alive,
    heartbeat_key,
    live_key,
    request_key,
    stream_key,
    terminal_key,
    unavailable_as_bus_error,
    wake_key,
)
from wire.bus.redis_bus.fanout import StreamFanout
from wire.codec import encode_event_without_seq, encode_request
from wire.events import Event, Terminal
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, decode_registry


class RedisBus:
    """Web side: one instance per event loop (asyncio clients are loop-bound)."""

    def __init__(self, url: str, *, response_ttl: int = 600, heartbeat_ttl: int = 6):
        self.response_ttl = response_ttl
        self.heartbeat_ttl = heartbeat_ttl
        # After a Redis restart every pooled asyncio connection is dead and
        # fails its next command once ("Connection closed by server"); retry
        # on a fresh connection instead of failing that many requests.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=POOL_WAIT,
            decode_responses=True,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=2,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            retry_on_error=[redis.ConnectionError],
        )
        self._redis = aioredis.Redis.from_pool(pool)
        self._if_open = self._redis.register_script(PUBLISH_IF_OPEN_LUA)
        # Blocking reads of every open response share one XREAD (fanout.py).
        self._fanout = StreamFanout(self._redis, wake_key(uuid.uuid4().hex))

    async def submit(self, worker_id: str, request: GenerationRequest) -> None:
        with unavailable_as_bus_error():
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(request_key(worker_id), {"r": encode_request(request)})
                pipe.expire(request_key(worker_id), INBOX_TTL)
                await pipe.execute()

    async def read_events(self, response_id: str, after_seq: int, block_ms: int) -> list[Event]:
        with unavailable_as_bus_error():
            if block_ms <= 0:
                # Nothing to wait for: one direct read, no shared state.
                reply = await self._redis.xread({stream_key(response_id): f"0-{after_seq}"})
                return _decode_events(reply)
            block_s = min(block_ms, MAX_BLOCK_MS) / 1000
            return await self._fanout.read(stream_key(response_id), after_seq, block_s)

    async def publish_if_open(self, response_id: str, event: Terminal) -> bool:
        body = encode_event_without_seq(event)
        with unavailable_as_bus_error():
            seq = await self._if_open(
                keys=[stream_key(response_id), terminal_key(response_id)],
                args=[body[1:], self.response_ttl],
            )
        return bool(seq)

    async def request_abort(self, worker_id: str, response_id: str) -> None:
        with unavailable_as_bus_error():
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(abort_key(worker_id), {"id": response_id})
                pipe.expire(abort_key(worker_id), INBOX_TTL)
                await pipe.execute()

    async def list_workers(self) -> list[WorkerInfo]:
        with unavailable_as_bus_error():
            registry = await self._redis.hgetall(WORKERS_KEY)
            if not registry:
                return []
            ids = list(registry)
            async with self._redis.pipeline(transaction=False) as pipe:
                for worker_id in ids:
                    pipe.mget(heartbeat_key(worker_id), live_key(worker_id))
                marks = await pipe.execute()
            # A killed worker leaves the routing table with its liveness key
            # (seconds), not its heartbeat: nothing is sent to it meanwhile.
            live = [alive(*pair) for pair in marks]
            dead = [w for w, ok in zip(ids, live, strict=True) if not ok]
            if dead:
                await self._redis.hdel(WORKERS_KEY, *dead)
        return decode_registry({w: registry[w] for w, ok in zip(ids, live, strict=True) if ok})

    async def worker_alive(self, worker_id: str) -> bool:
        with unavailable_as_bus_error():
            return alive(*await self._redis.mget(heartbeat_key(worker_id), live_key(worker_id)))

    async def close(self) -> None:
        await self._fanout.close()
        with contextlib.suppress(Exception):
            await self._redis.aclose()
