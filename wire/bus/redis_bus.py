"""The bus on Redis: streams for requests and events, keys for heartbeats.

Keys:
  llm:w:{worker_id}:req    stream of GenerationRequest JSON (field ``r``)
  llm:w:{worker_id}:abort  stream of response ids to abort (field ``id``)
  llm:r:{response_id}      stream of events (field ``e``), entry id 0-{seq}
  llm:r:{response_id}:term the terminal event's seq, once there is one
  llm:workers              hash worker_id -> WorkerInfo JSON
  llm:hb:{worker_id}       exists while the worker's heartbeat is fresh

Entry ids ``0-{seq}`` make resume exact: XREAD from ``0-{after_seq}``
returns precisely the events after it. Every append goes through a Lua
script that first checks the ``:term`` key, so a stream never gets a second
terminal event, whoever (worker or web tier) writes it.

Access (docker/redis/users.acl.template): the web's Redis user writes
``llm:w:*`` without reading it and reads ``llm:r:*``; a worker's user reads
``llm:w:*`` and writes ``llm:r:*`` without reading it, the registry and
heartbeats write-only. Credentials come in the URL (``BusConfig``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from wire.bus.base import BusUnavailable
from wire.events import TERMINAL_EVENTS
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo

WORKERS_KEY = "llm:workers"
# Open streams (worker still writing) expire this long after the last event,
# so the stream of a worker that died unobserved does not stay forever.
OPEN_STREAM_TTL = 3600
# Request and abort streams of a worker that vanished with work queued.
INBOX_TTL = 86400
# Longest single XREAD wait; the socket timeout must stay above it.
MAX_BLOCK_MS = 5000
SOCKET_TIMEOUT = 10.0
# Web tier: every open response blocks one connection in XREAD for up to a
# poll; redis-py's asyncio pool refuses its 101st connection by default, so
# past 100 concurrent streams per web process requests failed with
# bus_unavailable. A larger pool that waits (up to POOL_WAIT) when full.
MAX_CONNECTIONS = 1024
POOL_WAIT = 10.0

# The worker's append. ARGV: stream, term, seq, event JSON, is_terminal,
# response ttl, open ttl. The keys are arguments, not KEYS: Redis checks a
# script's declared keys for read and write access (it cannot tell how they
# are used), and a worker's ACL user may only write response streams. Each
# command inside is still checked against the user's key patterns; EXISTS
# needs no read access.
PUBLISH_LUA = """
if redis.call('EXISTS', ARGV[2]) == 1 then return 0 end
local added = redis.pcall('XADD', ARGV[1], '0-' .. ARGV[3], 'e', ARGV[4])
if type(added) == 'table' and added.err then return 0 end
if ARGV[5] == '1' then
  redis.call('SET', ARGV[2], ARGV[3], 'EX', ARGV[6])
  redis.call('EXPIRE', ARGV[1], ARGV[6])
else
  redis.call('EXPIRE', ARGV[1], ARGV[7])
end
return 1
"""

# KEYS: stream, term. ARGV: event JSON without its opening brace, ttl.
# The seq is one past the last entry, chosen inside the script so that it
# cannot collide with a worker append racing this call.
PUBLISH_IF_OPEN_LUA = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local seq = 1
if #last > 0 then seq = tonumber(string.match(last[1][1], '-(%d+)$')) + 1 end
redis.call('XADD', KEYS[1], '0-' .. seq, 'e', '{"seq":' .. seq .. ',' .. ARGV[1])
redis.call('SET', KEYS[2], seq, 'EX', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return seq
"""


def request_key(worker_id: str) -> str:
    return f"llm:w:{worker_id}:req"


def abort_key(worker_id: str) -> str:
    return f"llm:w:{worker_id}:abort"


def stream_key(response_id: str) -> str:
    return f"llm:r:{response_id}"


def terminal_key(response_id: str) -> str:
    return f"llm:r:{response_id}:term"


def heartbeat_key(worker_id: str) -> str:
    return f"llm:hb:{worker_id}"


@contextlib.contextmanager
def unavailable_as_bus_error() -> Iterator[None]:
    """Turn Redis connection trouble into BusUnavailable (the API's 503)."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise BusUnavailable(f"Redis is unavailable: {exc}") from exc


def _decode_events(reply: Any) -> list[dict[str, Any]]:
    if not reply:
        return []
    # XREAD reply: [[key, [(id, {field: value}), ...]]]
    return [json.loads(fields["e"]) for _, fields in reply[0][1]]


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

    async def submit(self, worker_id: str, request: GenerationRequest) -> None:
        with unavailable_as_bus_error():
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(request_key(worker_id), {"r": json.dumps(request.to_dict())})
                pipe.expire(request_key(worker_id), INBOX_TTL)
                await pipe.execute()

    async def read_events(
        self, response_id: str, after_seq: int, block_ms: int
    ) -> list[dict[str, Any]]:
        block = min(block_ms, MAX_BLOCK_MS) if block_ms > 0 else None
        with unavailable_as_bus_error():
            reply = await self._redis.xread(
                {stream_key(response_id): f"0-{after_seq}"}, block=block
            )
        return _decode_events(reply)

    async def publish_if_open(self, response_id: str, event: dict[str, Any]) -> bool:
        body = json.dumps({k: v for k, v in event.items() if k != "seq"})
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
                    pipe.exists(heartbeat_key(worker_id))
                alive = await pipe.execute()
            dead = [w for w, ok in zip(ids, alive, strict=True) if not ok]
            if dead:
                await self._redis.hdel(WORKERS_KEY, *dead)
        return [
            WorkerInfo.from_dict(json.loads(registry[w]))
            for w, ok in zip(ids, alive, strict=True)
            if ok
        ]

    async def worker_alive(self, worker_id: str) -> bool:
        with unavailable_as_bus_error():
            return bool(await self._redis.exists(heartbeat_key(worker_id)))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._redis.aclose()


class RedisWorkerBus:
    """Worker side: a sync client shared by the loop and heartbeat threads."""

    def __init__(self, url: str, *, response_ttl: int = 600, heartbeat_ttl: int = 6):
        self.response_ttl = response_ttl
        self.heartbeat_ttl = heartbeat_ttl
        self._redis = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=2
        )
        self._publish = self._redis.register_script(PUBLISH_LUA)
        # Last entry id consumed per worker's request and abort stream.
        self._cursors: dict[str, dict[str, str]] = {}

    def register(self, info: WorkerInfo) -> None:
        with unavailable_as_bus_error():
            # Requests left by an earlier incarnation were already failed by
            # the web tier when its heartbeat lapsed; never run them late.
            self._redis.delete(request_key(info.worker_id), abort_key(info.worker_id))
        self._cursors[info.worker_id] = {
            request_key(info.worker_id): "0-0",
            abort_key(info.worker_id): "0-0",
        }
        self.heartbeat(info)

    def heartbeat(self, info: WorkerInfo) -> None:
        info.heartbeat_at = time.time()
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(WORKERS_KEY, info.worker_id, json.dumps(info.to_dict()))
            pipe.set(heartbeat_key(info.worker_id), "1", ex=self.heartbeat_ttl)
            pipe.execute()

    def deregister(self, worker_id: str) -> None:
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(WORKERS_KEY, worker_id)
            pipe.delete(heartbeat_key(worker_id))
            pipe.execute()

    def poll(self, worker_id: str, block_ms: int) -> tuple[list[GenerationRequest], list[str]]:
        cursors = self._cursors.setdefault(
            worker_id, {request_key(worker_id): "0-0", abort_key(worker_id): "0-0"}
        )
        block = min(block_ms, MAX_BLOCK_MS) if block_ms > 0 else None
        with unavailable_as_bus_error():
            reply = self._redis.xread(dict(cursors), block=block)
            if not reply:
                return [], []
            requests: list[GenerationRequest] = []
            aborts: list[str] = []
            with self._redis.pipeline(transaction=False) as pipe:
                for key, entries in reply:
                    ids = [entry_id for entry_id, _ in entries]
                    cursors[key] = ids[-1]
                    # Consumed entries are deleted: the stream is a queue.
                    pipe.xdel(key, *ids)
                    for _, fields in entries:
                        if key == request_key(worker_id):
                            requests.append(GenerationRequest.from_dict(json.loads(fields["r"])))
                        else:
                            aborts.append(fields["id"])
                pipe.execute()
        return requests, aborts

    def publish(self, response_id: str, event: dict[str, Any]) -> bool:
        return response_id not in self.publish_many([(response_id, event)])

    def publish_many(self, batch: list[tuple[str, dict[str, Any]]]) -> set[str]:
        if not batch:
            return set()
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=False) as pipe:
            for response_id, event in batch:
                terminal = "1" if event["type"] in TERMINAL_EVENTS else "0"
                self._publish(
                    keys=[],
                    args=[
                        stream_key(response_id),
                        terminal_key(response_id),
                        event["seq"],
                        json.dumps(event),
                        terminal,
                        self.response_ttl,
                        OPEN_STREAM_TTL,
                    ],
                    client=pipe,
                )
            results = pipe.execute()
        return {rid for (rid, _), ok in zip(batch, results, strict=True) if not ok}

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._redis.close()
