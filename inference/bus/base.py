"""The contract between the web tier and the GPU workers.

Two implementations sit behind it: Redis Streams (multi-process) and an
in-process bus (embedded mode). The web tier and the worker loop only ever
see this interface.

Stream contract (ARCHITECTURE.md, "Stream contract"): every response has one
id; its events are ``created``, then ``delta`` events, then exactly one
terminal event (``completed``, ``incomplete``, ``failed`` or ``cancelled``).
Every event carries ``seq``, rising by one from 1 (``created``), so a client
can resume after the last sequence number it saw.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class EventType(StrEnum):
    CREATED = "created"
    DELTA = "delta"
    COMPLETED = "completed"  # finish_reason stop or length
    INCOMPLETE = "incomplete"  # content_filter
    FAILED = "failed"  # worker lost, internal error
    CANCELLED = "cancelled"  # client left or asked to stop


TERMINAL_EVENTS = frozenset(
    {EventType.COMPLETED, EventType.INCOMPLETE, EventType.FAILED, EventType.CANCELLED}
)


class WorkerState(StrEnum):
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"


@dataclass(slots=True)
class GenerationRequest:
    """One admitted request, as enqueued on a worker's request stream."""

    response_id: str
    model: str
    prompt_token_ids: list[int]
    # gpuworkers.engine.SamplingParams fields, as plain JSON values.
    sampling: dict[str, Any]
    priority: int = 0
    tier: str = "free"
    tenant_id: int | None = None
    # Per-tenant prefix-cache salt: tenants never share cached KV blocks.
    cache_salt: str | None = None
    created_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationRequest:
        return cls(**data)


@dataclass(slots=True)
class WorkerInfo:
    """A worker's heartbeat: who it is, what it serves and how loaded it is."""

    worker_id: str
    model: str
    state: WorkerState
    # The deployment's model version (rollouts route by it); "" when unversioned.
    version: str = ""
    running: int = 0
    waiting: int = 0
    swapped: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    queued_tokens: int = 0
    # Recent decode rate, for admission's wait estimate.
    tokens_per_second: float = 0.0
    heartbeat_at: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerInfo:
        data = dict(data)
        data["state"] = WorkerState(data["state"])
        return cls(**data)


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
