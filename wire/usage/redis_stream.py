"""The usage stream on Redis: ``llm:usage``, read by the ``settlers`` group.

Workers only XADD (their ACL user may write ``llm:usage`` and read
nothing); settlers (the web user) XREADGROUP, XAUTOCLAIM, XACK and XDEL.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from wire.bus.redis_bus.common import SOCKET_TIMEOUT, unavailable_as_bus_error
from wire.usage.base import CLAIM_IDLE_MS, GROUP, STREAM_KEY, Delivery
from wire.usage.entry import UsageEntry


def _delivery(entry_id: str, fields: dict[str, str] | None) -> Delivery:
    return Delivery(entry_id, (fields or {}).get("u"))


class RedisUsageStream:
    def __init__(self, url: str, *, key: str = STREAM_KEY):
        self.key = key
        self._redis = redis.Redis.from_url(
            url, decode_responses=True, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=2
        )
        self._group_ready = False

    def append(self, entries: Sequence[UsageEntry]) -> None:
        if not entries:
            return
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                pipe.xadd(self.key, {"u": entry.to_json()})
            pipe.execute()

    def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            # From the stream's start: entries appended before any settler
            # ever ran are settled too.
            self._redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def read(self, consumer: str, count: int, min_idle_ms: int = CLAIM_IDLE_MS) -> list[Delivery]:
        with unavailable_as_bus_error():
            self._ensure_group()
            # Reply: [next cursor, [(id, fields), ...], [ids deleted meanwhile]].
            claimed = self._redis.xautoclaim(
                self.key, GROUP, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
            )[1]
            deliveries = [_delivery(i, f) for i, f in claimed if i]
            if len(deliveries) < count:
                reply = self._redis.xreadgroup(
                    GROUP, consumer, {self.key: ">"}, count=count - len(deliveries)
                )
                for _, entries in reply or []:
                    deliveries.extend(_delivery(i, f) for i, f in entries)
        return deliveries

    def ack(self, entry_ids: Sequence[str]) -> None:
        if not entry_ids:
            return
        with unavailable_as_bus_error(), self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.key, GROUP, *entry_ids)
            pipe.xdel(self.key, *entry_ids)
            pipe.execute()

    def size(self) -> int:
        with unavailable_as_bus_error():
            return int(self._redis.xlen(self.key))

    def close(self) -> None:
        self._redis.close()
