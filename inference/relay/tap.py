"""The relay: a response's bus events -> SSE frames or one JSON completion.

One background task per response (``ResponseTap``) reads the event stream,
settles usage at the terminal event and feeds the HTTP response through a
queue. The task does not belong to the HTTP request, so a client that
disconnects still gets its usage recorded: the relay asks the worker to
abort and the tap records the tokens of the ``cancelled`` ending.

Rendering for the client is ``inference.api.sse`` (streams) or
``completion_response`` below (one JSON body).

Each tap is a ``relay`` span (a child of the HTTP request's, whose context
its task inherits) and feeds ``inference.metrics``: streams open, endings
by status, relay and usage-settlement lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from opentelemetry.trace import Span

from inference import metrics
from inference.admission.limits import LeaseKeeper
from inference.admission.settlement import Settlement, response_settle
from inference.api.openai_format import CompletionBuilder, UsageLedger
from inference.errors import APIError, InvalidRequest, ServerError, ServiceUnavailable
from inference.offload import idle_connections_close
from inference.relay.dispatch import cancel_request, stream_events
from inference.tool_calls.output import with_tool_calls
from inference.tool_calls.setup import ToolParsing
from wire.events import Created, Delta, ErrorInfo, Event, EventType, Terminal, TokenUsage
from wire.tracing import tracer

logger = logging.getLogger(__name__)

# Background tasks must be referenced until done: the event loop keeps only
# weak references, and a collected task would drop a usage record.
_background: set[asyncio.Task] = set()
# The taps still reading their response's events: what a graceful shutdown
# waits for, and ends at its deadline (inference.admission.drain).
_open_taps: set[ResponseTap] = set()


# A filter over a response's events (inference.moderation.reply_guard).
Guard = Callable[[AsyncIterator[Event]], AsyncIterator[Event]]


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def drain_background(timeout: float = 30.0) -> bool:
    """Wait for the relay's background tasks (tests, graceful shutdown).

    Returns whether all of them ended within ``timeout``.
    """
    # This loop's only: a task of another loop (a batch feeder's, a
    # thread's) cannot be awaited here.
    loop = asyncio.get_running_loop()
    pending = [t for t in _background if not t.done() and t.get_loop() is loop]
    if pending:
        _, still = await asyncio.wait(pending, timeout=timeout)
        return not still
    return True


def open_taps() -> list[ResponseTap]:
    """The responses of this process whose terminal event has not come yet."""
    return list(_open_taps)


def _has_tokens(event: Event) -> bool:
    return isinstance(event, Delta) and any(c.token_ids for c in event.choices)


def route_cache_key(response_id: str) -> str:
    return f"inference:route:{response_id}"


@dataclass(slots=True)
class ResponseRoute:
    """Who owns a response, where it runs and how its stream is rendered."""

    response_id: str
    tenant_id: int
    api_key_id: int | None
    model: str
    worker_id: str
    n: int
    logprobs: bool
    include_usage: bool
    created: int
    prompt_tokens: int
    model_version: str = ""
    # The tenant's tier when the request was sent: the web's latency
    # metrics are by tier (never by tenant).
    tier: str = ""
    # How to read tool calls out of the text; None: plain text.
    tool_parsing: ToolParsing | None = None
    # The service tier the request is served at (inference.service_tier):
    # echoed in the response, and a label of the latency metrics.
    service_tier: str = "default"


@dataclass(slots=True, frozen=True)
class ShutdownEnding(Terminal):
    """The ``failed`` ending this process gives a client when it stops: no
    event of the bus (its seq is no position a resume could skip to)."""


class ResponseTap:
    """Reads one response's events once, in a task of its own."""

    __slots__ = (
        "route",
        "headers",
        "task",
        "sent_at",
        "prompt_token_ids",
        "_queue",
        "_settlement",
        "_leases",
        "_ended",
        "_abort",
        "_guard",
        "_ledger",
    )

    def __init__(
        self,
        route: ResponseRoute,
        *,
        settlement: Settlement | None,
        abort_on_abandon: bool,
        sent_at: float | None = None,
        leases: LeaseKeeper | None = None,
        guard: Guard | None = None,
        prompt_token_ids: list[int] | None = None,
    ):
        self.route = route
        # The prompt as dispatched (completions' echo reads it); None: a resume.
        self.prompt_token_ids = prompt_token_ids
        # Safety (inference.moderation.reply_guard): filters the events, and
        # may end the response with content_filter before the worker does.
        self._guard = guard
        # When the request was enqueued (GenerationRequest.created_at): the
        # origin of the worker's durations, for the lag metrics.
        self.sent_at = sent_at
        # Extra response headers (rate-limit state) set before the response starts.
        self.headers: dict[str, str] = {}
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        # What the end of the response settles: its usage record and its
        # claims on the tenant's limits; None for a reader that settles
        # nothing (a resume).
        self._settlement = settlement
        # Renews the response's leases (slot, budget hold) while it is read.
        self._leases = leases
        self._ended = False
        self._abort = abort_on_abandon
        self._ledger = UsageLedger()
        self.task: asyncio.Task | None = None

    @classmethod
    def start(
        cls,
        route: ResponseRoute,
        *,
        settlement: Settlement | None = None,
        abort_on_abandon: bool = True,
        sent_at: float | None = None,
        leases: LeaseKeeper | None = None,
        guard: Guard | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> ResponseTap:
        tap = cls(
            route,
            settlement=settlement,
            abort_on_abandon=abort_on_abandon,
            sent_at=sent_at,
            leases=leases,
            guard=guard,
            prompt_token_ids=prompt_token_ids,
        )
        tap.task = spawn(tap._run())
        _open_taps.add(tap)
        tap.task.add_done_callback(lambda _: _open_taps.discard(tap))
        return tap

    async def _run(self) -> None:
        route = self.route
        attributes = {"response_id": route.response_id, "worker_id": route.worker_id}
        with (
            self._leases or contextlib.nullcontext(),
            metrics.STREAMS_OPEN.labels(route.model).track_inprogress(),
            tracer.start_as_current_span("relay", attributes=attributes) as span,
        ):
            span.set_attribute("llm.outcome", await self._relay(span))

    async def _relay(self, span: Span) -> str:
        """Read the events through the terminal one; returns its type."""
        ledger = self._ledger
        terminal: Terminal | None = None
        # The original request's tap times its first token; resumes do not.
        awaiting_first_token = self.sent_at is not None
        events = stream_events(self.route.response_id, worker_id=self.route.worker_id)
        if self._guard is not None:
            events = self._guard(events)
        try:
            async for event in events:
                ledger.add(event)
                if isinstance(event, Created) and event.worker_id:
                    # A peer took over a request its worker died holding:
                    # aborts and the usage record go to the one serving it.
                    self.route.worker_id = event.worker_id
                # stream_events ends right after the terminal event.
                if isinstance(event, Terminal):
                    terminal = event
                else:
                    if awaiting_first_token and _has_tokens(event):
                        awaiting_first_token = False
                        # The worker's first token, read off the bus here.
                        span.add_event("first_token")
                        metrics.first_token_observe(
                            tier=self.route.tier,
                            model=self.route.model,
                            sent_at=self.sent_at,
                            service_tier=self.route.service_tier,
                        )
                    self._queue.put_nowait(event)
        except asyncio.CancelledError:
            # Shutting down, or a resume reader whose client left: readers
            # must still see an ending, never hang.
            if not self._ended:
                self._end(terminal or _interrupted(ledger))
            raise
        except Exception:
            logger.exception("Reading the events of %s failed", self.route.response_id)
            if self._abort:
                # Its client gets a failed ending now; the worker must not
                # keep generating tokens that nobody reads or bills.
                spawn(_cancel_quietly(self.route))
        if self._leases is not None:
            # Ended: the settlement below releases what was renewed.
            self._leases.stop()
        final = terminal or _interrupted(ledger)
        model = self.route.model
        ended_at = metrics.worker_ended_at(final, sent_at=self.sent_at)
        metrics.lag_observe(metrics.RELAY_LAG, model, ended_at)
        if self._settlement is not None:
            metrics.RESPONSES.labels(model, final.type.value).inc()
            metrics.queue_wait_observe(
                tier=self.route.tier,
                model=model,
                terminal=final,
                service_tier=self.route.service_tier,
            )
            try:
                with tracer.start_as_current_span("usage.settle"):
                    await response_settle(
                        settlement=self._settlement,
                        route=self.route,
                        terminal=final,
                        usage=ledger.usage(final),
                    )
                metrics.lag_observe(metrics.SETTLEMENT_LAG, model, ended_at)
            except Exception:
                logger.exception("Settling the usage of %s failed", self.route.response_id)
            logger.info(
                "response %s %s: %s prompt + %s completion tokens",
                self.route.response_id,
                final.type.value,
                final.usage.prompt_tokens,
                final.usage.completion_tokens,
            )
        # Enqueued after settling, so a client that saw the end of its
        # response can already read its usage record.
        self._end(final)
        return final.type.value

    def _end(self, terminal: Terminal) -> None:
        self._ended = True
        self._queue.put_nowait(terminal)

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, or None when ``timeout`` passes first."""
        if timeout is None:
            return await self._queue.get()
        # asyncio.timeout, not wait_for: no extra task per event (this runs
        # once per token of every stream).
        try:
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            return None

    def shut_down(self) -> None:
        """This process is stopping: end the client's stream now with an
        explicit ``server_shutdown`` error and abort the generation.

        The tap goes on reading until the worker's ``cancelled`` ending and
        records its usage from it, as for a client that left; if the process
        stops first, the worker's usage entry records it (the settler).
        """
        if self._ended:
            return
        ending = _interrupted(
            self._ledger,
            message="The server is shutting down; the response was stopped.",
            code="server_shutdown",
        )
        self._end(ShutdownEnding(ending.type, ending.seq, ending.usage, error=ending.error))
        if self._abort:
            spawn(_cancel_quietly(self.route))
        elif self.task is not None:
            self.task.cancel()

    def abandon(self) -> None:
        """The client left before the end: abort the generation (or stop reading)."""
        if self._ended:
            return
        if self._abort:
            spawn(_cancel_quietly(self.route))
        elif self.task is not None:
            self.task.cancel()


def _interrupted(
    ledger: UsageLedger,
    *,
    message: str = "The response stream was interrupted",
    code: str = "stream_interrupted",
) -> Terminal:
    """A ``failed`` ending for a stream that could not be read to its end."""
    usage = TokenUsage(ledger.prompt_tokens, ledger.completion_tokens)
    error = ErrorInfo(message, code=code)
    return Terminal(EventType.FAILED, ledger.last_seq + 1, usage=usage, error=error)


async def _cancel_quietly(route: ResponseRoute) -> None:
    try:
        await cancel_request(route.response_id, worker_id=route.worker_id)
    except Exception:
        logger.warning("Could not cancel %s", route.response_id, exc_info=True)


def failed_error(event: Terminal) -> APIError:
    """The HTTP error for a response that failed before its first byte."""
    if event.type == EventType.CANCELLED:
        return ServiceUnavailable(
            "The response was cancelled before it finished.", code="cancelled"
        )
    error = event.error or ErrorInfo("The response failed.")
    message = error.message or "The response failed."
    if error.code == "server_shutdown":
        return ServiceUnavailable(message, code="server_shutdown")
    if error.type == "invalid_request_error":
        return InvalidRequest(message, param=error.param, code=error.code)
    return ServerError(message, code=error.code)


def ended_badly(event: Event | None) -> bool:
    """Whether ``event`` is a ``failed`` or ``cancelled`` ending."""
    return isinstance(event, Terminal) and event.type in (EventType.FAILED, EventType.CANCELLED)


async def completion_response(tap: ResponseTap) -> JsonResponse:
    """Wait for the whole response and answer one ``chat.completion``."""
    route = tap.route
    builder = with_tool_calls(
        CompletionBuilder(
            route.response_id,
            route.model,
            route.created,
            route.n,
            route.logprobs,
            service_tier=route.service_tier,
        ),
        route,
    )
    await release_db_connection()
    try:
        event = await collect(tap, builder)
    except asyncio.CancelledError:
        tap.abandon()
        raise
    if ended_badly(event):
        raise with_rate_headers(failed_error(event), tap)
    return with_headers(JsonResponse(builder.result(event)), tap.headers)


async def collect(tap: Any, builder: Any) -> Terminal:
    """Feed ``builder`` (anything with ``add``) every event of ``tap`` (a
    ResponseTap or alike) through the ending; returns the ending."""
    while True:
        event = await tap.next_event()
        if event is None:
            continue
        builder.add(event)
        if isinstance(event, Terminal):
            return event


async def release_db_connection() -> None:
    """Give the request's database connection back to the pool before a long wait.

    Under ASGI each request's sync calls share a thread of its own, whose
    connection Django keeps until the request ends; a response lasts as
    long as its generation, so DB_POOL_MAX open responses held every pooled
    connection and the next request waited DB_POOL_TIMEOUT, then failed.
    Anything later in the request that needs the database reconnects.
    """
    await sync_to_async(idle_connections_close)()


def with_rate_headers(error: APIError, tap: ResponseTap) -> APIError:
    """``error`` carrying the tap's headers: rate-limit headers go on every
    chat completion response, errors too."""
    error.headers = {**tap.headers, **error.headers}
    return error


def with_headers(response, headers: dict[str, str]):
    """``response`` with ``headers`` set on it."""
    for name, value in headers.items():
        response[name] = value
    return response
