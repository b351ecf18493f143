"""Fixtures for the request path: the demo model row and an in-process bus
with a scripted worker on it (the raw ASGI driver is in asgi_client.py).

The scripted worker is a real participant on the real in-process bus (the
one embedded mode uses): it registers, heartbeats, polls its inbox and
publishes events in the bus contract's shape. Only the tokens are scripted,
so relay tests run in milliseconds and need no model weights; the real
engine is exercised by tests/e2e.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from fleet.services import served_model_register
from wire.bus import get_worker_bus, reset_buses
from wire.events import (
    EventType,
    created_event,
    delta_event,
    error_body,
    metrics_body,
    terminal_event,
    usage_body,
)
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, WorkerState

DEMO = "smollm2-135m-instruct"


@pytest.fixture
def demo_model(tiers):
    """The demo model, open to every tier (transactional tests flush it)."""
    return served_model_register(name=DEMO, context_length=8192)


@pytest.fixture
def pro_key(api_key_factory, demo_model) -> str:
    return api_key_factory(tier="pro")[1]


def auth(key: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


@dataclass
class ScriptedWorker:
    """Answers each request with ``tokens`` deltas per choice, then a terminal.

    mode: "complete" (finish_reason length), "fail" (failed after the first
    delta), "reject" (created, then failed), "hold" (one delta, then waits
    for an abort and answers ``cancelled``).
    """

    model: str = DEMO
    tokens: int = 3
    mode: str = "complete"
    worker_id: str = "scripted-worker"
    received: list[GenerationRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _held: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def start(self) -> ScriptedWorker:
        self.bus = get_worker_bus()
        self.bus.register(self._info())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.bus.deregister(self.worker_id)

    def _info(self) -> WorkerInfo:
        return WorkerInfo(worker_id=self.worker_id, model=self.model, state=WorkerState.READY)

    def _run(self) -> None:
        beat = 0.0
        while not self._stop.is_set():
            # More often than the liveness TTL (1.5 s), as a real worker.
            if time.monotonic() - beat > 0.3:
                self.bus.heartbeat(self._info())
                beat = time.monotonic()
            requests, aborts = self.bus.poll(self.worker_id, 50)
            for request in requests:
                self.received.append(request)
                self._answer(request)
            for response_id in aborts:
                self.aborted.append(response_id)
                self._cancel(response_id)

    def _answer(self, request: GenerationRequest) -> None:
        rid, n, prompt = request.response_id, request.sampling["n"], len(request.prompt_token_ids)
        self.bus.publish(
            rid,
            created_event(
                response_id=rid, model=self.model, worker_id=self.worker_id, prompt_tokens=prompt
            ),
        )
        if self.mode == "reject":
            error = error_body(
                "Prompt too long for the KV cache",
                type="invalid_request_error",
                code="prompt_too_long",
            )
            self.bus.publish(
                rid,
                terminal_event(
                    EventType.FAILED, 2, usage=usage_body(prompt_tokens=prompt), error=error
                ),
            )
            return
        seq = 1
        steps = 1 if self.mode in ("fail", "hold") else self.tokens
        for step in range(steps):
            last = step == self.tokens - 1
            choices = [
                {
                    "index": i,
                    "text": f"c{i}t{step} ",
                    "token_ids": [100 + step],
                    "logprobs": None,
                    "finish_reason": "length" if last else None,
                }
                for i in range(n)
            ]
            seq += 1
            self.bus.publish(rid, delta_event(seq, choices))
        usage = usage_body(
            prompt_tokens=prompt, completion_tokens=steps * n, cached_tokens=min(prompt, 16)
        )
        metrics = metrics_body(queue_time_ms=1.4, ttft_ms=5.6, duration_ms=9.2)
        if self.mode == "hold":
            self._held[rid] = (seq, prompt, steps * n)
        elif self.mode == "fail":
            self.bus.publish(
                rid,
                terminal_event(
                    EventType.FAILED,
                    seq + 1,
                    usage=usage,
                    metrics=metrics,
                    error=error_body("GPU fell over", code="internal_error"),
                ),
            )
        else:
            reasons = {str(i): "length" for i in range(n)}
            self.bus.publish(
                rid,
                terminal_event(
                    EventType.COMPLETED,
                    seq + 1,
                    usage=usage,
                    metrics=metrics,
                    finish_reasons=reasons,
                ),
            )

    def _cancel(self, response_id: str) -> None:
        if response_id not in self._held:
            return
        seq, prompt, completion = self._held.pop(response_id)
        usage = usage_body(prompt_tokens=prompt, completion_tokens=completion)
        event = terminal_event(
            EventType.CANCELLED, seq + 1, usage=usage, finish_reasons={"0": "abort"}
        )
        self.bus.publish(response_id, event)


@pytest.fixture
def memory_bus(settings):
    """The in-process bus (embedded mode's), without starting an engine."""
    settings.REDIS_URL = None
    settings.EMBEDDED_ENGINE = False
    reset_buses()
    yield
    reset_buses()


@pytest.fixture
def worker_factory(memory_bus) -> Callable[..., ScriptedWorker]:
    started: list[ScriptedWorker] = []

    def make(**kwargs: Any) -> ScriptedWorker:
        worker = ScriptedWorker(**kwargs).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


@pytest.fixture
def close_db_threads():
    """Close the connections that sync_to_async threads opened (async tests)."""
    yield
    from asgiref.sync import async_to_sync

    async_to_sync(sync_to_async(connections.close_all))()
