"""The worker's side of the Redis bus (sync, shared by the worker's threads)."""

from __future__ import annotations

import contextlib
import json
import time

import redis

from wire.bus.base import LIVENESS_TTL
from wire.bus.redis_bus.common import (
    GROUP,
    INBOX_TTL,
    LIVENESS_MARK,
    OPEN_STREAM_TTL,
    PUBLISH_LUA,
    SOCKET_TIMEOUT,
    WORKERS_KEY,
    abort_key,
    closed_key,
    heartbeat_key,
    inboxes_key,
    live_key,
    request_key,
    stream_key,
    terminal_key,
    unavailable_as_bus_error,
)
from wire.bus.redis_bus.intake import Intake
from wire.codec import encode_event
from wire.events import Event, Terminal
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo


class RedisWorkerBus:
    """Worker side: a sync client shared by the loop, heartbeat and liveness threads."""

    def __init__(self, url: str, *, response_ttl: int = 600, heartbeat_ttl: int = 6):
        self.response_ttl = response_ttl
        self.heartbeat_ttl = heartbeat_ttl
        self._redis = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=2
        )
        self._publish = self._redis.register_script(PUBLISH_LUA)
        self._intakes: dict[str, Intake] = {}

    def _intake(self, worker_id: str, model: str | None = None) -> Intake:
        intake = self._intakes.get(worker_id)
        if intake is None or (model is not None and intake.model != model):
            intake = self._intakes[worker_id] = Intake(
                self._redis, worker_id, model, self.publish_many
            )
        return intake

    def register(self, info: WorkerInfo) -> None:
        worker_id = info.worker_id
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=True) as pipe:
            # Requests left by an earlier incarnation of this id: the relays
            # waiting on them failed them (worker_lost); never run them late.
            # One DEL per key family: the ACL grants them to different rules.
            pipe.delete(request_key(worker_id), abort_key(worker_id))
            pipe.delete(closed_key(worker_id))
            for key in (request_key(worker_id), abort_key(worker_id)):
                pipe.xgroup_create(key, GROUP, id="0", mkstream=True)
                pipe.expire(key, INBOX_TTL)
            pipe.sadd(inboxes_key(info.model), worker_id)
            pipe.execute()
        self._intake(worker_id, info.model)
        self.heartbeat(info)

    def heartbeat(self, info: WorkerInfo) -> None:
        info.heartbeat_at = time.time()
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(WORKERS_KEY, info.worker_id, json.dumps(info.to_dict()))
            pipe.set(heartbeat_key(info.worker_id), LIVENESS_MARK, ex=self.heartbeat_ttl)
            # A heartbeat is a sign of life too (the liveness thread's own
            # refresh is what keeps it fresh between beats).
            pipe.set(live_key(info.worker_id), "1", px=int(LIVENESS_TTL * 1000))
            # Again each beat: a restarted Redis lost the set.
            pipe.sadd(inboxes_key(info.model), info.worker_id)
            pipe.execute()
        self._intake(info.worker_id, info.model)

    def liveness(self, worker_id: str) -> None:
        with unavailable_as_bus_error():
            self._redis.set(live_key(worker_id), "1", px=int(LIVENESS_TTL * 1000))

    def deregister(self, worker_id: str) -> None:
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(WORKERS_KEY, worker_id)
            pipe.delete(heartbeat_key(worker_id), live_key(worker_id), closed_key(worker_id))
            pipe.execute()

    def poll(
        self, worker_id: str, block_ms: int, *, accept: bool = True
    ) -> tuple[list[GenerationRequest], list[str]]:
        with unavailable_as_bus_error():
            return self._intake(worker_id).poll(block_ms, accept=accept)

    def ack(self, worker_id: str, response_ids: list[str]) -> None:
        with unavailable_as_bus_error():
            self._intake(worker_id).ack(response_ids)

    def close_inbox(self, worker_id: str) -> None:
        with unavailable_as_bus_error():
            self._redis.set(closed_key(worker_id), "1", ex=INBOX_TTL)

    def hand_back(self, worker_id: str) -> list[GenerationRequest]:
        with unavailable_as_bus_error():
            return self._intake(worker_id).hand_back()

    def publish(self, response_id: str, event: Event) -> bool:
        return response_id not in self.publish_many([(response_id, event)])

    def publish_many(self, batch: list[tuple[str, Event]]) -> set[str]:
        if not batch:
            return set()
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=False) as pipe:
            for response_id, event in batch:
                terminal = "1" if isinstance(event, Terminal) else "0"
                self._publish(
                    keys=[],
                    args=[
                        stream_key(response_id),
                        terminal_key(response_id),
                        event.seq,
                        encode_event(event),
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
