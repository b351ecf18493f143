"""A worker's intake on Redis: consumer-group reads, acks and reclaims.

Every worker has its own request stream (the router picks the replica for
its prefix cache), read through the consumer group ``workers``. A request
stays in the group's pending list from its read until the worker acks it,
which it does once the request is admitted and its ``created`` event is
published (or it ended before that). From then on the response has a
stream that a client may be reading, so it is never run again elsewhere;
until then nothing of it was seen, so another worker may run it.

Reclaim: every ``RECLAIM_INTERVAL`` each worker looks at the inboxes of the
other workers of its model (``llm:inboxes:{model}``). From a dead one (its
liveness key gone) it claims the pending entries (XPENDING + XCLAIM; the
claim is atomic, so two peers never both get one) and reads what was never
delivered; from a draining one (``:closed``) only what was never
delivered. A claimed request whose response stream exists already started
and is dropped (the web tier fails it: ``worker_lost``); one aborted
meanwhile ends ``cancelled``; one delivered more than ``MAX_DELIVERIES``
times ends ``failed`` (``worker_lost``, retry budget spent); the rest are
served here. A dead worker's inbox is deleted once it is empty and its
heartbeat has lapsed too (the router stopped sending to it long before).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from wire.bus.base import MAX_DELIVERIES, RECLAIM_INTERVAL, RECLAIM_MIN_IDLE_MS
from wire.bus.redis_bus.common import (
    GROUP,
    INBOX_TTL,
    MAX_BLOCK_MS,
    abort_key,
    closed_key,
    heartbeat_key,
    inboxes_key,
    live_key,
    request_key,
    stream_key,
)
from wire.codec import decode_request
from wire.events import Event, EventType, Terminal, retries_spent_error
from wire.requests import GenerationRequest

# Entries taken from one peer's inbox per reclaim round.
RECLAIM_BATCH = 32

Publish = Callable[[list[tuple[str, Event]]], set[str]]


class Intake:
    """One worker's reads from its inbox and its dead or draining peers'."""

    def __init__(self, client: redis.Redis, worker_id: str, model: str | None, publish: Publish):
        self._redis = client
        self.worker_id = worker_id
        # None until the worker registers: no peers to reclaim from.
        self.model = model
        self._publish = publish
        # response_id -> (request stream, entry id), read but not acked.
        self._pending: dict[str, tuple[str, str]] = {}
        self._next_reclaim = 0.0

    # -- own inbox ---------------------------------------------------------

    def poll(self, block_ms: int, *, accept: bool) -> tuple[list[GenerationRequest], list[str]]:
        requests = self._reclaim() if accept else []
        block = min(block_ms, MAX_BLOCK_MS) if block_ms > 0 and not requests else None
        streams = {abort_key(self.worker_id): ">"}
        if accept:
            streams[request_key(self.worker_id)] = ">"
        reply = self._read(streams, block)
        aborts: list[str] = []
        with self._redis.pipeline(transaction=False) as pipe:
            for key, entries in reply or []:
                for entry_id, fields in entries:
                    if key == request_key(self.worker_id):
                        request = decode_request(fields["r"])
                        self._pending[request.response_id] = (key, entry_id)
                        requests.append(request)
                    else:
                        aborts.append(fields["id"])
                        # An abort needs no second chance: done once read.
                        pipe.xack(key, GROUP, entry_id)
                        pipe.xdel(key, entry_id)
            pipe.execute()
        return requests, aborts

    def _read(self, streams: dict[str, str], block: int | None) -> Any:
        try:
            return self._redis.xreadgroup(GROUP, self.worker_id, streams, block=block)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        # The group is gone (Redis restarted empty) or was never made
        # (a worker polling before it registered): make it, read again.
        with self._redis.pipeline(transaction=False) as pipe:
            for key in streams:
                pipe.xgroup_create(key, GROUP, id="0", mkstream=True)
                pipe.expire(key, INBOX_TTL)
            pipe.execute(raise_on_error=False)
        return self._redis.xreadgroup(GROUP, self.worker_id, streams, block=block)

    def ack(self, response_ids: list[str]) -> None:
        taken = [self._pending.pop(r) for r in response_ids if r in self._pending]
        if not taken:
            return
        with self._redis.pipeline(transaction=False) as pipe:
            for key, entry_id in taken:
                pipe.xack(key, GROUP, entry_id)
                # The stream is a queue: an acked entry has no further use.
                pipe.xdel(key, entry_id)
            pipe.execute()

    def hand_back(self) -> list[GenerationRequest]:
        """Leave queued requests to live peers, or return them to be failed."""
        if self.model is not None and self._live_peers():
            return []
        key = request_key(self.worker_id)
        reply = self._read({key: ">"}, None)
        requests = []
        for _, entries in reply or []:
            for entry_id, fields in entries:
                request = decode_request(fields["r"])
                self._pending[request.response_id] = (key, entry_id)
                requests.append(request)
        return requests

    # -- peers ---------------------------------------------------------------

    def _peers(self) -> list[tuple[str, bool, bool, bool]]:
        """(worker id, alive, draining, heartbeat fresh) of the model's other workers."""
        peers = sorted(self._redis.smembers(inboxes_key(self.model)) - {self.worker_id})
        with self._redis.pipeline(transaction=False) as pipe:
            for peer in peers:
                pipe.exists(live_key(peer))
                pipe.exists(closed_key(peer))
                pipe.exists(heartbeat_key(peer))
            flags = pipe.execute()
        return [
            (peer, bool(flags[3 * i]), bool(flags[3 * i + 1]), bool(flags[3 * i + 2]))
            for i, peer in enumerate(peers)
        ]

    def _live_peers(self) -> list[str]:
        return [p for p, alive, draining, beat in self._peers() if alive and beat and not draining]

    def _reclaim(self) -> list[GenerationRequest]:
        now = time.monotonic()
        if self.model is None or now < self._next_reclaim:
            return []
        self._next_reclaim = now + RECLAIM_INTERVAL
        taken: list[GenerationRequest] = []
        for peer, alive, draining, beating in self._peers():
            dead = not (alive and beating)
            if dead or draining:
                taken += self._take_from(peer, dead=dead, gone=not beating)
        return taken

    def _take_from(self, peer: str, *, dead: bool, gone: bool) -> list[GenerationRequest]:
        key = request_key(peer)
        entries: list[tuple[str, dict[str, str], int]] = []
        if dead:
            entries += self._claim_pending(key)
        reply = self._read({key: ">"}, None)
        for _, fresh in reply or []:
            entries += [(entry_id, fields, 1) for entry_id, fields in fresh]
        if not entries:
            if gone and not self._redis.xpending(key, GROUP)["pending"]:
                self._forget_inbox(peer)
            return []
        return self._sort_out(peer, key, entries)

    def _claim_pending(self, key: str) -> list[tuple[str, dict[str, str], int]]:
        pending = self._redis.xpending_range(
            key, GROUP, min="-", max="+", count=RECLAIM_BATCH, idle=RECLAIM_MIN_IDLE_MS
        )
        holders = {p["consumer"] for p in pending}
        with self._redis.pipeline(transaction=False) as pipe:
            for holder in holders:
                pipe.exists(live_key(holder))
            holder_alive = dict(zip(holders, pipe.execute(), strict=True))
        claimed = []
        for item in pending:
            # A live peer that claimed it is serving it; leave it alone.
            if holder_alive[item["consumer"]] and item["consumer"] != self.worker_id:
                continue
            got = self._redis.xclaim(
                key, GROUP, self.worker_id, RECLAIM_MIN_IDLE_MS, [item["message_id"]]
            )
            for entry_id, fields in got:
                if fields:  # None: the entry was deleted meanwhile
                    claimed.append((entry_id, fields, item["times_delivered"] + 1))
        return claimed

    def _sort_out(
        self, peer: str, key: str, entries: list[tuple[str, dict[str, str], int]]
    ) -> list[GenerationRequest]:
        """Serve, cancel, fail or drop each request taken from ``peer``."""
        aborted = {fields["id"] for _, fields in self._redis.xrange(abort_key(peer))}
        requests = [decode_request(f["r"]) for _, f, _ in entries]
        with self._redis.pipeline(transaction=False) as pipe:
            for request in requests:
                pipe.exists(stream_key(request.response_id))
            started = pipe.execute()
        serve, endings, done = [], [], []
        for (entry_id, _, deliveries), request, has_stream in zip(
            entries, requests, started, strict=True
        ):
            if has_stream:
                done.append(entry_id)  # started: never replayed
            elif request.response_id in aborted:
                endings.append((request.response_id, Terminal(EventType.CANCELLED, 1)))
                done.append(entry_id)
            elif deliveries > MAX_DELIVERIES:
                error = retries_spent_error(deliveries - 1)
                failed = Terminal(EventType.FAILED, 1, error=error)
                endings.append((request.response_id, failed))
                done.append(entry_id)
            else:
                self._pending[request.response_id] = (key, entry_id)
                serve.append(request)
        self._publish(endings)
        if done:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.xack(key, GROUP, *done)
                pipe.xdel(key, *done)
                pipe.execute()
        return serve

    def _forget_inbox(self, peer: str) -> None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(inboxes_key(self.model), peer)
            pipe.delete(request_key(peer), abort_key(peer))
            pipe.delete(closed_key(peer))
            pipe.execute()
