"""The bus interface between the web tier and the GPU workers.

Two implementations sit behind it: Redis Streams (multi-process,
``redis_bus``) and an in-process bus (embedded mode, ``memory_bus``). The
web tier and the worker loop only ever see this interface. What travels on
it is defined in ``wire.requests``, ``wire.events`` and ``wire.workers``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from wire.events import TERMINAL_EVENTS
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo


class BusUnavailable(RuntimeError):
    """The bus (Redis) cannot be reached; the API answers 503."""


class Bus(Protocol):
    """Async side, used by the web tier."""

    async def submit(self, worker_id: str, request: GenerationRequest) -> None: ...

    async def read_events(
        self, response_id: str, after_seq: int, block_ms: int
    ) -> list[dict[str, Any]]:
        """Events with seq > after_seq, waiting up to block_ms for the first.

        ``block_ms`` 0 means do not wait at all (unlike Redis' BLOCK 0).
        """
        ...

    async def publish_if_open(self, response_id: str, event: dict[str, Any]) -> bool:
        """Append a terminal event unless the stream already has one.

        The bus assigns ``seq`` (one past the stream's last event), atomically
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

    def deregister(self, worker_id: str) -> None: ...

    def poll(self, worker_id: str, block_ms: int) -> tuple[list[GenerationRequest], list[str]]:
        """New requests and response ids to abort, waiting up to block_ms."""
        ...

    def publish(self, response_id: str, event: dict[str, Any]) -> bool:
        """Append one event; False when the stream already ended (dropped)."""
        ...

    def publish_many(self, batch: list[tuple[str, dict[str, Any]]]) -> set[str]:
        """Append events in order, in one round trip.

        Events for a stream that already has a terminal event (the web tier
        declared the worker lost, or gave up waiting) are dropped; their
        response ids are returned so the worker can abort them.
        """
        ...


async def iterate_events(
    bus: Bus, response_id: str, after_seq: int = 0, block_ms: int = 1000
) -> AsyncIterator[dict[str, Any]]:
    """Yield events after ``after_seq`` until (and including) the terminal one."""
    seq = after_seq
    while True:
        for event in await bus.read_events(response_id, seq, block_ms):
            seq = event["seq"]
            yield event
            if event["type"] in TERMINAL_EVENTS:
                return
