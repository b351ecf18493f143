"""The bus interface between the web tier and the GPU workers.

Two implementations sit behind it: Redis Streams (multi-process,
``redis_bus``) and an in-process bus (embedded mode, ``memory_bus``). The
web tier and the worker loop only ever see this interface. What travels on
it is defined in ``wire.requests``, ``wire.events`` and ``wire.workers``, and
encoded by ``wire.codec``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from wire.events import Event, Terminal
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo

# Liveness (issue 17): a key with a short TTL that a worker's own thread
# (never the engine's) refreshes. A killed process stops refreshing at once,
# so its streams end within about LIVENESS_TTL plus one relay poll, while a
# long engine step cannot look like death: the refresher needs only the GIL
# for a moment, which Python hands over every few milliseconds and torch
# and the ctypes kernels release while they compute. Chosen over Redis'
# connection signal (a killed process's socket closes at once; CLIENT LIST
# would see it): that needs the CLIENT command, which the web's ACL user
# must not have (it lists every client), and the in-process bus has no
# connections to watch.
# The web declares death only after a second look a refresh interval later
# (inference.relay.dispatch.DEATH_CONFIRM_SECONDS), so a refresher may be
# late by about TTL + that before a worker's streams are failed.
LIVENESS_TTL = 1.2
LIVENESS_INTERVAL = 0.3
# Deliveries of a request (its first read included) before it is failed
# rather than handed to another worker: a request that killed two workers
# is not tried on a third.
MAX_DELIVERIES = 2
# How often a worker looks for requests that a dead or draining peer of its
# model left unstarted; and how long a claimed entry must have been idle
# before another peer may take it over (the claimer died too).
RECLAIM_INTERVAL = 1.0
RECLAIM_MIN_IDLE_MS = 1000


class BusUnavailable(RuntimeError):
    """The bus (Redis) cannot be reached; the API answers 503."""


class Bus(Protocol):
    """Async side, used by the web tier."""

    async def submit(self, worker_id: str, request: GenerationRequest) -> None: ...

    async def read_events(self, response_id: str, after_seq: int, block_ms: int) -> list[Event]:
        """Events with seq > after_seq, waiting up to block_ms for the first.

        ``block_ms`` 0 means do not wait at all (unlike Redis' BLOCK 0).
        """
        ...

    async def publish_if_open(self, response_id: str, event: Terminal) -> bool:
        """Append a terminal event unless the stream already has one.

        The bus assigns ``seq`` (``event.seq`` is ignored) (one past the stream's last event), atomically
        with the check, so a worker finishing at the same moment and this
        call never both land. True when this event became the terminal one.
        """
        ...

    async def request_abort(self, worker_id: str, response_id: str) -> None: ...

    async def list_workers(self) -> list[WorkerInfo]:
        """Workers with a live heartbeat; dead ones are dropped from the registry."""
        ...

    async def worker_alive(self, worker_id: str) -> bool:
        """Whether the worker's heartbeat has not expired."""
        ...

    async def close(self) -> None: ...


class WorkerBus(Protocol):
    """Sync side, used by the worker loop (one thread owns the engine)."""

    def register(self, info: WorkerInfo) -> None: ...

    def heartbeat(self, info: WorkerInfo) -> None: ...

    def liveness(self, worker_id: str) -> None:
        """Refresh the short-lived liveness mark (``LIVENESS_TTL``)."""
        ...

    def deregister(self, worker_id: str) -> None: ...

    def poll(
        self, worker_id: str, block_ms: int, *, accept: bool = True
    ) -> tuple[list[GenerationRequest], list[str]]:
        """New requests and response ids to abort, waiting up to block_ms.

        Requests come from the worker's own inbox and, every
        ``RECLAIM_INTERVAL``, from inboxes of dead or draining peers of its
        model (unstarted ones only). Each stays pending until ``ack``; a
        request whose worker dies before that is reclaimed by a peer, or
        failed once ``MAX_DELIVERIES`` is spent. ``accept=False``
        (draining) takes no requests, only aborts.
        """
        ...

    def ack(self, worker_id: str, response_ids: list[str]) -> None:
        """The requests are admitted (their ``created`` is published) or
        ended: they can no longer be handed to another worker."""
        ...

    def close_inbox(self, worker_id: str) -> None:
        """Draining: peers of the model may take requests still queued here."""
        ...

    def hand_back(self, worker_id: str) -> list[GenerationRequest]:
        """Leaving: queued requests stay for live peers of the model, or,
        when there is none, come back to be failed (then ``ack`` them)."""
        ...

    def publish(self, response_id: str, event: Event) -> bool:
        """Append one event; False when the stream already ended (dropped)."""
        ...

    def publish_many(self, batch: list[tuple[str, Event]]) -> set[str]:
        """Append events in order, in one round trip.

        Events for a stream that already has a terminal event (the web tier
        declared the worker lost, or gave up waiting) are dropped; their
        response ids are returned so the worker can abort them.
        """
        ...


async def iterate_events(
    bus: Bus, response_id: str, after_seq: int = 0, block_ms: int = 1000
) -> AsyncIterator[Event]:
    """Yield events after ``after_seq`` until (and including) the terminal one."""
    seq = after_seq
    while True:
        for event in await bus.read_events(response_id, seq, block_ms):
            seq = event.seq
            yield event
            if isinstance(event, Terminal):
                return
