"""The in-process bus for embedded mode: same semantics as Redis, no Redis.

One object serves both sides: the worker loop calls the sync ``WorkerBus``
methods from its thread, web requests await the ``Bus`` methods on their
event loops. One lock guards all state. Worker-side waits use a
``threading.Condition``; an awaiting reader parks an ``asyncio.Event`` that
publishers set through ``loop.call_soon_threadsafe``, so nothing polls.

Events are stored as JSON text, as Redis stores them, so neither side can
mutate what the other sees and anything not serializable fails here too.

Intake follows the Redis consumer group (``redis_bus.intake``): a request
read stays pending until acked; peers of a model take unstarted requests
from dead or draining workers' inboxes, within ``MAX_DELIVERIES``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from wire.bus.base import LIVENESS_TTL, MAX_DELIVERIES, RECLAIM_INTERVAL, RECLAIM_MIN_IDLE_MS
from wire.codec import decode_event, decode_request, encode_event, encode_request
from wire.events import Event, EventType, Terminal, retries_spent_error
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, decode_registry

# An open stream lives this long after its last event (a dead worker's
# stream must not stay forever); a finished one lives response_ttl.
OPEN_STREAM_TTL = 3600.0


@dataclass(slots=True)
class _Stream:
    events: list[str] = field(default_factory=list)  # JSON, index = seq - 1
    terminal_seq: int | None = None
    expires_at: float = 0.0
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    payload: str
    deliveries: int
    holder: str
    taken_at: float


@dataclass(slots=True)
class _Inbox:
    requests: deque[str] = field(default_factory=deque)
    aborts: deque[str] = field(default_factory=deque)
    # response_id -> read, not acked yet (the consumer group's pending list).
    pending: dict[str, _Pending] = field(default_factory=dict)
    model: str | None = None
    closed: bool = False


class MemoryBus:
    """Both halves of the bus, in one process."""

    def __init__(self, *, response_ttl: float = 600.0, heartbeat_ttl: float = 6.0):
        self.response_ttl = response_ttl
        self.heartbeat_ttl = heartbeat_ttl
        self._lock = threading.Lock()
        self._inbox_ready = threading.Condition(self._lock)
        self._streams: dict[str, _Stream] = {}
        self._inboxes: dict[str, _Inbox] = {}
        self._workers: dict[str, str] = {}  # worker_id -> WorkerInfo JSON
        self._heartbeats: dict[str, float] = {}  # worker_id -> monotonic deadline
        self._live: dict[str, float] = {}  # worker_id -> liveness deadline
        # worker_id -> {response_id: inbox it was taken from}, until acked.
        self._taken: dict[str, dict[str, str]] = {}
        self._next_reclaim: dict[str, float] = {}
        self._next_sweep = 0.0

    # -- web side (async) ---------------------------------------------------

    async def submit(self, worker_id: str, request: GenerationRequest) -> None:
        payload = encode_request(request)
        with self._inbox_ready:
            self._inboxes.setdefault(worker_id, _Inbox()).requests.append(payload)
            self._inbox_ready.notify_all()

    async def read_events(self, response_id: str, after_seq: int, block_ms: int) -> list[Event]:
        deadline = time.monotonic() + block_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            wake = asyncio.Event()
            with self._lock:
                stream = self._live_stream(response_id)
                if stream is not None and len(stream.events) > after_seq:
                    return [decode_event(e) for e in stream.events[after_seq:]]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                # A reader may wait on a stream the worker has not created yet.
                if stream is None:
                    stream = self._streams[response_id] = _Stream(
                        expires_at=time.monotonic() + OPEN_STREAM_TTL
                    )
                stream.waiters.append((loop, wake))
            try:
                await asyncio.wait_for(wake.wait(), remaining)
            except TimeoutError:
                pass
            finally:
                with self._lock:
                    if (stream := self._streams.get(response_id)) is not None:
                        stream.waiters = [w for w in stream.waiters if w[1] is not wake]

    async def publish_if_open(self, response_id: str, event: Terminal) -> bool:
        with self._lock:
            stream = self._live_stream(response_id)
            if stream is None:
                stream = self._streams[response_id] = _Stream()
            if stream.terminal_seq is not None:
                return False
            self._append(stream, replace(event, seq=len(stream.events) + 1))
            return True

    async def request_abort(self, worker_id: str, response_id: str) -> None:
        with self._inbox_ready:
            self._inboxes.setdefault(worker_id, _Inbox()).aborts.append(response_id)
            self._inbox_ready.notify_all()

    async def list_workers(self) -> list[WorkerInfo]:
        with self._lock:
            self._drop_dead_workers()
            return decode_registry(self._workers)

    async def worker_alive(self, worker_id: str) -> bool:
        with self._lock:
            return self._alive(worker_id)

    async def close(self) -> None:
        """Nothing to release; the bus lives as long as the process."""

    # -- worker side (sync) -------------------------------------------------

    def register(self, info: WorkerInfo) -> None:
        with self._lock:
            # Requests left by an earlier incarnation were already failed
            # by the web tier when it found the worker dead.
            self._inboxes[info.worker_id] = _Inbox(model=info.model)
            self._taken[info.worker_id] = {}
        self.heartbeat(info)

    def heartbeat(self, info: WorkerInfo) -> None:
        info.heartbeat_at = time.time()
        with self._lock:
            self._workers[info.worker_id] = json.dumps(info.to_dict())
            self._heartbeats[info.worker_id] = time.monotonic() + self.heartbeat_ttl
            self._inboxes.setdefault(info.worker_id, _Inbox()).model = info.model
            # A heartbeat is a sign of life too (see RedisWorkerBus.heartbeat).
            self._live[info.worker_id] = time.monotonic() + LIVENESS_TTL

    def liveness(self, worker_id: str) -> None:
        with self._lock:
            self._live[worker_id] = time.monotonic() + LIVENESS_TTL

    def deregister(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)
            self._heartbeats.pop(worker_id, None)
            self._live.pop(worker_id, None)

    def poll(
        self, worker_id: str, block_ms: int, *, accept: bool = True
    ) -> tuple[list[GenerationRequest], list[str]]:
        deadline = time.monotonic() + block_ms / 1000
        with self._inbox_ready:
            inbox = self._inboxes.setdefault(worker_id, _Inbox())
            taken = self._reclaim(worker_id) if accept else []
            while not taken and not (inbox.requests and accept) and not inbox.aborts:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], []
                self._inbox_ready.wait(remaining)
                inbox = self._inboxes.setdefault(worker_id, _Inbox())
            if accept:
                while inbox.requests:
                    taken.append(self._take(worker_id, worker_id, inbox.requests.popleft(), 1))
            aborts = list(inbox.aborts)
            inbox.aborts.clear()
            return taken, aborts

    def ack(self, worker_id: str, response_ids: list[str]) -> None:
        with self._lock:
            taken = self._taken.setdefault(worker_id, {})
            for response_id in response_ids:
                origin = taken.pop(response_id, None)
                if origin is not None and origin in self._inboxes:
                    self._inboxes[origin].pending.pop(response_id, None)

    def close_inbox(self, worker_id: str) -> None:
        with self._inbox_ready:
            self._inboxes.setdefault(worker_id, _Inbox()).closed = True
            self._inbox_ready.notify_all()

    def hand_back(self, worker_id: str) -> list[GenerationRequest]:
        with self._lock:
            inbox = self._inboxes.setdefault(worker_id, _Inbox())
            peers = [
                w
                for w, other in self._inboxes.items()
                if w != worker_id and other.model == inbox.model and not other.closed
            ]
            if any(self._alive(w) for w in peers):
                return []
            taken = []
            while inbox.requests:
                taken.append(self._take(worker_id, worker_id, inbox.requests.popleft(), 1))
            return taken

    def publish(self, response_id: str, event: Event) -> bool:
        return response_id not in self.publish_many([(response_id, event)])

    def publish_many(self, batch: list[tuple[str, Event]]) -> set[str]:
        closed: set[str] = set()
        with self._lock:
            for response_id, event in batch:
                stream = self._live_stream(response_id)
                if stream is None:
                    stream = self._streams[response_id] = _Stream()
                if stream.terminal_seq is not None or event.seq != len(stream.events) + 1:
                    closed.add(response_id)
                    continue
                self._append(stream, event)
            self._sweep()
        return closed

    # -- internals (lock held) ----------------------------------------------

    def _alive(self, worker_id: str) -> bool:
        # Either lapsing is death (see redis_bus.common.alive).
        now = time.monotonic()
        live = self._live.get(worker_id, float("inf"))
        return self._heartbeats.get(worker_id, 0.0) > now and live > now

    def _take(self, worker_id: str, origin: str, payload: str, deliveries: int):
        request = decode_request(payload)
        pending = _Pending(payload, deliveries, worker_id, time.monotonic())
        self._inboxes[origin].pending[request.response_id] = pending
        self._taken.setdefault(worker_id, {})[request.response_id] = origin
        return request

    def _reclaim(self, worker_id: str) -> list[GenerationRequest]:
        """Unstarted requests of dead or draining peers (see redis_bus.intake)."""
        now = time.monotonic()
        model = self._inboxes[worker_id].model
        if model is None or now < self._next_reclaim.get(worker_id, 0.0):
            return []
        self._next_reclaim[worker_id] = now + RECLAIM_INTERVAL
        taken = []
        for peer, inbox in list(self._inboxes.items()):
            dead = not self._alive(peer)
            if peer == worker_id or inbox.model != model or not (dead or inbox.closed):
                continue
            found = [(p, 0) for p in inbox.requests]
            inbox.requests.clear()
            if dead:
                idle = now - RECLAIM_MIN_IDLE_MS / 1000
                for response_id, held in list(inbox.pending.items()):
                    holder_gone = held.holder == peer or not self._alive(held.holder)
                    if holder_gone and held.taken_at <= idle:
                        del inbox.pending[response_id]
                        self._taken.get(held.holder, {}).pop(response_id, None)
                        found.append((held.payload, held.deliveries))
            for payload, deliveries in found:
                response_id = decode_request(payload).response_id
                stream = self._live_stream(response_id)
                if stream is not None and stream.events:
                    continue  # started: never replayed
                ending = None
                if response_id in inbox.aborts:
                    ending = Terminal(EventType.CANCELLED, 1)
                elif deliveries + 1 > MAX_DELIVERIES:
                    error = retries_spent_error(deliveries)
                    ending = Terminal(EventType.FAILED, 1, error=error)
                if ending is None:
                    taken.append(self._take(worker_id, peer, payload, deliveries + 1))
                    continue
                stream = stream or self._streams.setdefault(response_id, _Stream())
                self._append(stream, ending)
        return taken

    def _append(self, stream: _Stream, event: Event) -> None:
        stream.events.append(encode_event(event))
        if isinstance(event, Terminal):
            stream.terminal_seq = event.seq
            stream.expires_at = time.monotonic() + self.response_ttl
        else:
            stream.expires_at = time.monotonic() + OPEN_STREAM_TTL
        for loop, wake in stream.waiters:
            # A reader whose loop already closed needs no wake-up.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)
        stream.waiters.clear()

    def _live_stream(self, response_id: str) -> _Stream | None:
        stream = self._streams.get(response_id)
        if stream is not None and stream.expires_at <= time.monotonic() and not stream.waiters:
            del self._streams[response_id]
            return None
        return stream

    def _sweep(self) -> None:
        """Forget expired streams, at most once a second."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        for response_id in [k for k, s in self._streams.items() if s.expires_at <= now]:
            self._live_stream(response_id)

    def _drop_dead_workers(self) -> None:
        for worker_id in [w for w in self._heartbeats if not self._alive(w)]:
            self._heartbeats.pop(worker_id)
            self._workers.pop(worker_id, None)
        for worker_id in [w for w in self._workers if w not in self._heartbeats]:
            self._workers.pop(worker_id)
