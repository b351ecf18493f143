"""Hand admitted requests to GPU workers and read their event streams back.

What the API layer calls (all async): ``dispatch_request`` picks a ready
worker for the model (``fleet.router``: the model's weighted versions, then
the conversation's replica on a consistent-hash ring, load permitting) and
enqueues the request, ``stream_events`` yields the
response's events through the terminal one, ``cancel_request`` asks the
worker to stop. ``stream_events`` never hangs: a worker whose heartbeat
lapses, a stream with no progress for too long and a bus that stays down
all end the stream with a ``failed`` event.

Tracing: ``dispatch`` spans the routing and admission decision and
``bus.submit`` (a producer span) the enqueue; the request carries the
latter's ``traceparent``, so the worker's spans join the same trace.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from django.conf import settings
from opentelemetry.trace import SpanKind

from fleet.router import Policy, RouteDecision, route
from fleet.shadow import shadow_maybe
from fleet.snapshot import asnapshot_current
from inference.admission.queue_wait import admission_check
from wire import logs
from wire.bus import Bus, BusUnavailable, get_bus
from wire.events import (
    Created,
    ErrorInfo,
    Event,
    EventType,
    Terminal,
    usage_of,
    worker_lost_error,
)
from wire.requests import GenerationRequest
from wire.tracing import traceparent_current, tracer
from wire.workers import WorkerInfo, WorkerState

logger = logging.getLogger(__name__)

__all__ = [
    "BusUnavailable",
    "ModelWarmingUp",
    "NoWorkerAvailable",
    "cancel_request",
    "dispatch_request",
    "get_bus",
    "stream_events",
    "wait_for_terminal",
]

# One read waits this long before the worker's liveness is checked.
POLL_MS = 300
# A worker found dead is looked at again this much later before its streams
# are failed: a live worker's refresher (every LIVENESS_INTERVAL, 0.3 s)
# has put its key back by then, so one missed window (a Redis stall that
# ran the refresh after the check, a CPU-starved refresher) ends nothing.
# A killed worker's streams end within the liveness key's TTL
# (wire.bus.base.LIVENESS_TTL, 1.2 s) plus at most one poll plus this:
# under 2 s (python -m bench.chaos prints the figure).
DEATH_CONFIRM_SECONDS = 0.35
# A dead worker's request that has no event yet may still be taken over by
# a peer of the model (wire.bus reclaims it within about a second); its
# stream is failed only if none did within this many seconds.
RECLAIM_GRACE_SECONDS = 5.0
# Seconds the bus may stay unreachable before an open stream is failed.
BUS_GRACE_SECONDS = 3.0
# A worker whose KV cache is this full is picked only if all others are too.
KV_NEARLY_FULL = 0.95
# Prompt tokens hashed as the routing key when the caller gives none: about a
# system prompt and a first message, the part a conversation's turns share.
DEFAULT_KEY_TOKENS = 256
# Seconds a client is told to wait (Retry-After) while the model's engine
# loads and warms up: the demo model takes 10-20 s on a laptop's CPU.
WARMING_RETRY_AFTER = 5


class NoWorkerAvailable(RuntimeError):
    """No ready worker serves the model; the API answers 503."""

    def __init__(self, model: str, reason: str | None = None):
        super().__init__(reason or f"No ready worker is serving model '{model}'")
        self.model = model


class ModelWarmingUp(NoWorkerAvailable):
    """The model's workers are still loading or warming up: retry shortly.

    Answered at once (503 with Retry-After) rather than by holding the
    request until a worker is ready, which looked like a hang.
    """

    def __init__(self, model: str):
        super().__init__(model, f"The model '{model}' is warming up. Retry in a few seconds.")
        self.retry_after = WARMING_RETRY_AFTER


# worker_id -> [heartbeat_at seen, requests sent since, prompt tokens sent
# since]. Heartbeats come once a second; without this a burst of requests
# would all land on whichever worker looked idlest at the last beat.
_sent_since_heartbeat: dict[str, list[float]] = {}


def _load_key(info: WorkerInfo) -> tuple[bool, float, float]:
    sent = _sent_since_heartbeat.get(info.worker_id)
    extra_n, extra_tokens = (sent[1], sent[2]) if sent and sent[0] == info.heartbeat_at else (0, 0)
    return (
        info.kv_usage >= KV_NEARLY_FULL,
        info.running + info.waiting + extra_n,
        info.queued_tokens + extra_tokens,
    )


def _queue_depth(info: WorkerInfo) -> float:
    return _load_key(info)[1]


def _note_sent(info: WorkerInfo, prompt_tokens: int) -> None:
    sent = _sent_since_heartbeat.get(info.worker_id)
    if sent is None or sent[0] != info.heartbeat_at:
        sent = _sent_since_heartbeat[info.worker_id] = [info.heartbeat_at, 0, 0]
    sent[1] += 1
    sent[2] += prompt_tokens


class EmbeddedWorkerHandle(Protocol):
    """What dispatch needs of the in-process worker (``gpuworkers.embedded``)."""

    ready: threading.Event
    error: BaseException | None


# Embedded mode: the process's set-up (config.apps) registers how to start
# the in-process worker; the web apps never import the worker itself.
_embedded_starter: Callable[[], EmbeddedWorkerHandle] | None = None


def embedded_worker_register(starter: Callable[[], EmbeddedWorkerHandle]) -> None:
    """Tell dispatch how to start (or find) this process's embedded worker."""
    global _embedded_starter
    _embedded_starter = starter


async def _ensure_embedded_ready() -> None:
    if _embedded_starter is None:
        raise NoWorkerAvailable(settings.DEMO_MODEL_NAME, "No embedded engine in this process")
    worker = _embedded_starter()
    if not worker.ready.is_set():
        raise ModelWarmingUp(settings.DEMO_MODEL_NAME)
    if worker.error is not None:
        raise NoWorkerAvailable(
            settings.DEMO_MODEL_NAME, f"The embedded engine failed to start: {worker.error}"
        )


async def dispatch_request(
    request: GenerationRequest,
    *,
    bus: Bus | None = None,
    routing_key: str | None = None,
    shadow_allowed: bool = False,
) -> WorkerInfo:
    """Enqueue ``request`` on the replica the router picks for it.

    ``routing_key`` identifies the conversation (``fleet.routing``);
    without one, the first prompt tokens stand in for it.
    ``shadow_allowed``: the tenant opted in to shadow comparisons during
    rollouts (``Tenant.shadow_opt_in``); without it no copy is made. Raises
    ModelWarmingUp while the model's workers load and warm up,
    NoWorkerAvailable when no ready worker serves the model and
    BusUnavailable when Redis cannot be reached (all are 503s).
    """
    attributes = {"llm.model": request.model, "llm.tier": request.tier}
    with tracer.start_as_current_span("dispatch", attributes=attributes) as span:
        worker = await _dispatch(request, bus, routing_key, shadow_allowed)
        span.set_attribute("worker_id", worker.worker_id)
        return worker


async def _dispatch(
    request: GenerationRequest, bus: Bus | None, routing_key: str | None, shadow_allowed: bool
) -> WorkerInfo:
    if settings.EMBEDDED_ENGINE:
        await _ensure_embedded_ready()
    bus = bus or get_bus()
    registry = await bus.list_workers()
    for gone in _sent_since_heartbeat.keys() - {w.worker_id for w in registry}:
        _sent_since_heartbeat.pop(gone, None)
    if routing_key is None:
        routing_key = ",".join(map(str, request.prompt_token_ids[:DEFAULT_KEY_TOKENS]))
    snapshot = await asnapshot_current()
    decision = route(
        registry,
        model=request.model,
        routing_key=routing_key,
        snapshot=snapshot,
        load=_load_key,
        queue_depth=_queue_depth,
        policy=Policy(settings.FLEET_ROUTING_POLICY),
    )
    if decision is None:
        if any(w.model == request.model and w.state == WorkerState.WARMING for w in registry):
            raise ModelWarmingUp(request.model)
        raise NoWorkerAvailable(request.model)
    worker = decision.worker
    logs.bind(worker=worker.worker_id)
    # Admission control (issue 5): a 429 with Retry-After now, when the
    # estimated wait exceeds the tier's SLA, rather than a timeout later.
    await admission_check(worker, request)
    attributes = {
        "messaging.system": "redis" if settings.REDIS_URL else "in-process",
        "messaging.destination.name": worker.worker_id,
        "messaging.operation.type": "send",
    }
    with tracer.start_as_current_span("bus.submit", kind=SpanKind.PRODUCER, attributes=attributes):
        # The worker's spans are children of this one.
        request.traceparent = traceparent_current()
        await bus.submit(worker.worker_id, request)
    _note_sent(worker, len(request.prompt_token_ids))
    if shadow_allowed:
        await _shadow(bus, registry, request, decision, routing_key, snapshot)
    return worker


async def _shadow(bus, registry, request, decision: RouteDecision, routing_key, snapshot) -> None:
    """Also run a share of the stable version's requests on the canary (rollouts)."""
    rollout = snapshot.rollout_of(request.model) if snapshot else None
    if rollout is None or rollout.shadow_share <= 0 or decision.version == rollout.canary_version:
        return
    try:
        await shadow_maybe(
            bus=bus,
            registry=registry,
            request=request,
            rollout=rollout,
            stable_worker=decision.worker,
            routing_key=routing_key,
            note_sent=_note_sent,
        )
    except Exception:
        # The user's request is already enqueued; its shadow is optional.
        logger.warning("shadow of %s not sent", request.response_id, exc_info=True)


async def cancel_request(response_id: str, *, worker_id: str, bus: Bus | None = None) -> None:
    """Ask the worker to abort; it answers with a ``cancelled`` terminal event."""
    await (bus or get_bus()).request_abort(worker_id, response_id)


async def _close_stream(bus: Bus, response_id: str, error: ErrorInfo) -> None:
    """Write a ``failed`` terminal unless the worker got there first."""
    seen = await bus.read_events(response_id, 0, 0)
    event = Terminal(EventType.FAILED, 0, usage=usage_of(seen), error=error)
    await bus.publish_if_open(response_id, event)


async def stream_events(
    response_id: str,
    *,
    worker_id: str,
    after_seq: int = 0,
    bus: Bus | None = None,
    idle_timeout: float | None = None,
) -> AsyncIterator[Event]:
    """Yield the events after ``after_seq``, through the terminal one.

    A lost worker (liveness key expired) ends the stream with ``failed``
    (code ``worker_lost``) about two seconds after its death; if the
    response had no event yet, a peer may take the request over, so the
    stream waits ``RECLAIM_GRACE_SECONDS`` for the peer's ``created`` (whose
    ``worker_id`` it follows from then on) before it fails.
    ``idle_timeout`` seconds without any event aborts the request and fails
    the stream (``stream_timeout``). Both are written to the stream itself,
    so a resuming client sees the same ending.
    """
    bus = bus or get_bus()
    if idle_timeout is None:
        idle_timeout = float(settings.STREAM_IDLE_TIMEOUT)
    watch = _Watch(bus, response_id, worker_id, idle_timeout)
    seq = after_seq
    bus_down_since: float | None = None
    while True:
        try:
            events = await bus.read_events(response_id, seq, POLL_MS)
            if not events:
                await watch.check()
            bus_down_since = None
        except BusUnavailable:
            now = time.monotonic()
            bus_down_since = bus_down_since or now
            if now - bus_down_since >= BUS_GRACE_SECONDS:
                # Not on the stream (the bus is down): only this reader sees it.
                yield Terminal(EventType.FAILED, seq + 1, error=_bus_lost_error())
                return
            await asyncio.sleep(0.25)
            continue
        for event in events:
            seq = event.seq
            watch.progress(event)
            yield event
            if isinstance(event, Terminal):
                return


class _Watch:
    """Whether a quiet stream's worker is alive, stalled or handed over."""

    __slots__ = ("bus", "response_id", "worker_id", "idle_timeout", "last_progress", "lost_at")

    def __init__(self, bus: Bus, response_id: str, worker_id: str, idle_timeout: float):
        self.bus = bus
        self.response_id = response_id
        self.worker_id = worker_id
        self.idle_timeout = idle_timeout
        self.last_progress = time.monotonic()
        self.lost_at: float | None = None

    def progress(self, event: Event) -> None:
        self.last_progress = time.monotonic()
        self.lost_at = None
        if isinstance(event, Created) and event.worker_id:
            # A peer that took the request over is the worker from now on.
            self.worker_id = event.worker_id

    async def check(self) -> None:
        bus = self.bus
        if await bus.worker_alive(self.worker_id):
            self.lost_at = None
            if time.monotonic() - self.last_progress >= self.idle_timeout:
                await bus.request_abort(self.worker_id, self.response_id)
                message = f"The response made no progress for {self.idle_timeout:.0f} seconds"
                await _close_stream(
                    bus, self.response_id, ErrorInfo(message, code="stream_timeout")
                )
            return
        # The second look: death is declared only if the worker is still
        # missing a refresh interval later.
        await asyncio.sleep(DEATH_CONFIRM_SECONDS)
        if await bus.worker_alive(self.worker_id):
            logger.info("worker %s missed one liveness window; still alive", self.worker_id)
            return
        seen = await bus.read_events(self.response_id, 0, 0)
        owner = seen[0].worker_id if seen and isinstance(seen[0], Created) else None
        if owner and owner != self.worker_id:
            # A resume that started from a stale route: follow the stream's worker.
            self.worker_id = owner
            return
        now = time.monotonic()
        self.lost_at = self.lost_at or now
        if not seen and now - self.lost_at < RECLAIM_GRACE_SECONDS:
            return  # not started: a peer may still take it over
        await _close_stream(bus, self.response_id, worker_lost_error())


def _bus_lost_error() -> ErrorInfo:
    return ErrorInfo(
        "The message bus became unavailable; the response stream was lost",
        code="bus_unavailable",
    )


async def wait_for_terminal(
    response_id: str,
    *,
    worker_id: str,
    after_seq: int = 0,
    timeout: float = 30.0,
    bus: Bus | None = None,
) -> Terminal | None:
    """Drain the stream and return its terminal event (None on timeout).

    For a relay whose client left: after ``cancel_request`` the
    ``cancelled`` event carries the usage to record.
    """

    async def drain() -> Terminal | None:
        async for event in stream_events(
            response_id, worker_id=worker_id, after_seq=after_seq, bus=bus
        ):
            if isinstance(event, Terminal):
                return event
        return None

    try:
        return await asyncio.wait_for(drain(), timeout)
    except TimeoutError:
        return None
