"""The one fake worker: a real participant on the real in-process bus.

It registers, heartbeats, polls its inbox, takes aborts and publishes
typed events in the bus contract's shape, as a ``gpuworker`` does; only the
tokens are scripted, so request-path tests run in milliseconds and need no
model weights (the real engine is exercised by ``tests/plugins/engine.py``
users and tests/e2e). One class serves every test that used to have a
worker of its own (scripted, paced, canned text, held until released).

``fake_worker(**options)`` starts one and stops it after the test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.plugins.request_path import DEMO
from wire.bus import get_worker_bus
from wire.events import (
    ChoiceDelta,
    Created,
    Delta,
    ErrorInfo,
    Event,
    EventType,
    Terminal,
    Timings,
    TokenUsage,
)
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, WorkerState

# What every ending reports as the worker's timings (milliseconds).
TIMINGS = Timings(queue_time_ms=1.4, ttft_ms=5.6, duration_ms=9.2)
MODES = ("complete", "fail", "reject", "hold")


@dataclass
class _Stream:
    request: GenerationRequest
    seq: int = 1
    # Deltas published so far (steps, each with every choice).
    sent: int = 0
    due: float = 0.0
    held: bool = False

    @property
    def prompt(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def n(self) -> int:
        return self.request.sampling.n


@dataclass
class FakeWorker:
    """Answers each request with scripted deltas, then an ending.

    tokens: deltas per response; each carries every choice's text
        ``c{i}t{step} `` and token 100 + step (the last ends ``length``).
    texts: instead, choice 0's deltas, one token each (the last ends
        ``stop``): a test decides exactly where a token boundary falls.
    interval: seconds between a response's deltas (0: all at once).
    mode: ``complete``; ``fail`` (failed after the first delta);
        ``reject`` (created, then failed); ``hold`` (one delta, then waits
        for ``release()`` or an abort, which ends it ``cancelled``).
    cached: prompt tokens every ending reports as read from the prefix
        cache (at most the prompt).

    Like a real worker it stops generating once the web tier ended the
    response's stream (its publish is refused: ``closed_under_me``), and
    its heartbeat counts a KV block per running response.
    """

    tokens: int = 3
    texts: list[str] | None = None
    interval: float = 0.0
    mode: str = "complete"
    model: str = DEMO
    worker_id: str = "fake-worker"
    version: str = ""
    cached: int = 16
    received: list[GenerationRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    # Responses whose stream the web tier ended while this worker generated.
    closed_under_me: list[str] = field(default_factory=list)
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")

    def start(self) -> FakeWorker:
        self.bus = get_worker_bus()
        self.bus.register(self.info())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.bus.deregister(self.worker_id)

    def info(self) -> WorkerInfo:
        running = len(self._streams)
        return WorkerInfo(
            worker_id=self.worker_id,
            model=self.model,
            state=WorkerState.READY,
            version=self.version,
            running=running,
            kv_blocks_used=running,
            kv_blocks_total=64,
        )

    def release(self, *, completion_tokens: int | None = None) -> None:
        """Complete every held response: one last delta, then ``completed``
        (reporting ``completion_tokens`` when given, else what was sent)."""
        with self._lock:
            for rid, stream in list(self._streams.items()):
                if not stream.held:
                    continue
                del self._streams[rid]
                stream.seq += 1
                stream.sent += 1
                self._publish(
                    stream, Delta(stream.seq, (ChoiceDelta(0, "done", (7,), None, "stop"),))
                )
                sent = stream.sent * stream.n if completion_tokens is None else completion_tokens
                self._end(stream, EventType.COMPLETED, completion=sent, reasons={0: "stop"})

    # -- the loop --------------------------------------------------------------

    def _run(self) -> None:
        beat = 0.0
        while not self._stop.is_set():
            # More often than the liveness TTL (1.5 s), as a real worker.
            if time.monotonic() - beat > 0.2:
                self.bus.heartbeat(self.info())
                beat = time.monotonic()
            requests, aborts = self.bus.poll(self.worker_id, self._block_ms())
            with self._lock:
                for request in requests:
                    self.received.append(request)
                    self._open(request)
                for response_id in aborts:
                    self.aborted.append(response_id)
                    stream = self._streams.pop(response_id, None)
                    if stream is not None:
                        self._end(stream, EventType.CANCELLED, reasons={0: "abort"})
                self._advance()

    def _block_ms(self) -> int:
        due = [s.due for s in self._streams.values() if not s.held]
        if not due:
            return 50
        return max(0, min(50, int((min(due) - time.monotonic()) * 1000)))

    def _open(self, request: GenerationRequest) -> None:
        stream = _Stream(request, due=time.monotonic())
        created = Created(
            response_id=request.response_id,
            model=self.model,
            worker_id=self.worker_id,
            prompt_tokens=stream.prompt,
        )
        if not self._publish(stream, created):
            return
        if self.mode == "reject":
            error = ErrorInfo(
                "Prompt too long for the KV cache",
                type="invalid_request_error",
                code="prompt_too_long",
            )
            stream.seq += 1
            usage = TokenUsage(prompt_tokens=stream.prompt)
            self._publish(stream, Terminal(EventType.FAILED, stream.seq, usage=usage, error=error))
            return
        self._streams[request.response_id] = stream

    def _advance(self) -> None:
        """Publish every delta that is due (all of them when interval is 0)."""
        steps = len(self.texts) if self.texts is not None else self.tokens
        for rid, stream in list(self._streams.items()):
            while not stream.held and stream.due <= time.monotonic():
                stream.seq += 1
                last = stream.sent == steps - 1
                if not self._publish(stream, self._delta(stream, last)):
                    del self._streams[rid]
                    break
                stream.sent += 1
                stream.due += self.interval
                if self.mode == "hold":
                    stream.held = True
                elif self.mode == "fail":
                    del self._streams[rid]
                    error = ErrorInfo("GPU fell over", code="internal_error")
                    self._end(stream, EventType.FAILED, error=error)
                elif last:
                    del self._streams[rid]
                    final = "stop" if self.texts is not None else "length"
                    reasons = {i: final for i in range(stream.n)}
                    self._end(stream, EventType.COMPLETED, reasons=reasons)
                if rid not in self._streams or self.interval:
                    break

    def _delta(self, stream: _Stream, last: bool) -> Delta:
        step = stream.sent
        if self.texts is not None:
            choices = (
                ChoiceDelta(0, self.texts[step], (100 + step,), None, "stop" if last else None),
            )
        else:
            choices = tuple(
                ChoiceDelta(i, f"c{i}t{step} ", (100 + step,), None, "length" if last else None)
                for i in range(stream.n)
            )
        return Delta(stream.seq, choices)

    def _end(
        self,
        stream: _Stream,
        kind: EventType,
        *,
        completion: int | None = None,
        reasons: dict[int, str] | None = None,
        error: ErrorInfo | None = None,
    ) -> None:
        n = 1 if self.texts is not None else stream.n
        usage = TokenUsage(
            prompt_tokens=stream.prompt,
            completion_tokens=stream.sent * n if completion is None else completion,
            cached_tokens=min(stream.prompt, self.cached),
        )
        stream.seq += 1
        ending = Terminal(
            kind,
            stream.seq,
            usage=usage,
            metrics=TIMINGS,
            finish_reasons=reasons or {},
            error=error,
        )
        self._publish(stream, ending)

    def _publish(self, stream: _Stream, event: Event) -> bool:
        rid = stream.request.response_id
        published = self.bus.publish(rid, event)
        if not published and rid not in self.closed_under_me:
            self.closed_under_me.append(rid)
        return published


@pytest.fixture
def fake_worker(memory_bus) -> Iterator[Callable[..., FakeWorker]]:
    """``fake_worker(**options) -> FakeWorker``, started on the in-process bus."""
    started: list[FakeWorker] = []

    def make(**options: Any) -> FakeWorker:
        worker = FakeWorker(**options).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()
