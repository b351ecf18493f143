"""The in-process bus for embedded mode: same semantics as Redis, no Redis.

One object serves both sides: the worker loop calls the sync ``WorkerBus``
methods from its thread, web requests await the ``Bus`` methods on their
event loops. One lock guards all state. Worker-side waits use a
``threading.Condition``; an awaiting reader parks an ``asyncio.Event`` that
publishers set through ``loop.call_soon_threadsafe``, so nothing polls.

Events are stored as JSON text, as Redis stores them, so neither side can
mutate what the other sees and anything not serializable fails here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from wire.events import TERMINAL_EVENTS
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo

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
class _Inbox:
    requests: deque[str] = field(default_factory=deque)
    aborts: deque[str] = field(default_factory=deque)


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
        self._next_sweep = 0.0

    # -- web side (async) ---------------------------------------------------

    async def submit(self, worker_id: str, request: GenerationRequest) -> None:
        payload = json.dumps(request.to_dict())
        with self._inbox_ready:
            self._inboxes.setdefault(worker_id, _Inbox()).requests.append(payload)
            self._inbox_ready.notify_all()

    async def read_events(
        self, response_id: str, after_seq: int, block_ms: int
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + block_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            wake = asyncio.Event()
            with self._lock:
                stream = self._live_stream(response_id)
                if stream is not None and len(stream.events) > after_seq:
                    return [json.loads(e) for e in stream.events[after_seq:]]
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

    async def publish_if_open(self, response_id: str, event: dict[str, Any]) -> bool:
        with self._lock:
            stream = self._live_stream(response_id)
            if stream is None:
                stream = self._streams[response_id] = _Stream()
            if stream.terminal_seq is not None:
                return False
            self._append(stream, {**event, "seq": len(stream.events) + 1})
            return True

    async def request_abort(self, worker_id: str, response_id: str) -> None:
        with self._inbox_ready:
            self._inboxes.setdefault(worker_id, _Inbox()).aborts.append(response_id)
            self._inbox_ready.notify_all()

    async def list_workers(self) -> list[WorkerInfo]:
        with self._lock:
            self._drop_dead_workers()
            return [WorkerInfo.from_dict(json.loads(v)) for v in self._workers.values()]

    async def worker_alive(self, worker_id: str) -> bool:
        with self._lock:
            return self._heartbeats.get(worker_id, 0.0) > time.monotonic()

    async def close(self) -> None:
        """Nothing to release; the bus lives as long as the process."""

    # -- worker side (sync) -------------------------------------------------

    def register(self, info: WorkerInfo) -> None:
        with self._lock:
            # Requests left by an earlier incarnation were already failed
            # by the web tier when its heartbeat lapsed.
            self._inboxes[info.worker_id] = _Inbox()
        self.heartbeat(info)

    def heartbeat(self, info: WorkerInfo) -> None:
        info.heartbeat_at = time.time()
        with self._lock:
            self._workers[info.worker_id] = json.dumps(info.to_dict())
            self._heartbeats[info.worker_id] = time.monotonic() + self.heartbeat_ttl

    def deregister(self, worker_id: str) -> None:
        with self._lock:
            self._workers.pop(worker_id, None)
            self._heartbeats.pop(worker_id, None)

    def poll(self, worker_id: str, block_ms: int) -> tuple[list[GenerationRequest], list[str]]:
        deadline = time.monotonic() + block_ms / 1000
        with self._inbox_ready:
            inbox = self._inboxes.setdefault(worker_id, _Inbox())
            while not inbox.requests and not inbox.aborts:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return [], []
                self._inbox_ready.wait(remaining)
                inbox = self._inboxes.setdefault(worker_id, _Inbox())
            requests = [GenerationRequest.from_dict(json.loads(r)) for r in inbox.requests]
            aborts = list(inbox.aborts)
            inbox.requests.clear()
            inbox.aborts.clear()
            return requests, aborts

    def publish(self, response_id: str, event: dict[str, Any]) -> bool:
        return response_id not in self.publish_many([(response_id, event)])

    def publish_many(self, batch: list[tuple[str, dict[str, Any]]]) -> set[str]:
        closed: set[str] = set()
        with self._lock:
            for response_id, event in batch:
                stream = self._live_stream(response_id)
                if stream is None:
                    stream = self._streams[response_id] = _Stream()
                if stream.terminal_seq is not None or event["seq"] != len(stream.events) + 1:
                    closed.add(response_id)
                    continue
                self._append(stream, event)
            self._sweep()
        return closed

    # -- internals (lock held) ----------------------------------------------

    def _append(self, stream: _Stream, event: dict[str, Any]) -> None:
        stream.events.append(json.dumps(event))
        if event["type"] in TERMINAL_EVENTS:
            stream.terminal_seq = event["seq"]
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
        now = time.monotonic()
        for worker_id in [w for w, t in self._heartbeats.items() if t <= now]:
            self._heartbeats.pop(worker_id)
            self._workers.pop(worker_id, None)
        for worker_id in [w for w in self._workers if w not in self._heartbeats]:
            self._workers.pop(worker_id)
