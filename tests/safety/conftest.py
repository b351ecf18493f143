"""Safety fixtures: a worker whose replies are scripted text, and a clean policy cache.

``TextWorker`` is the request path's scripted worker (tests/inference/
conftest.py) on the real in-process bus, answering with the deltas it is
given, one token each, so a test decides exactly where a token boundary
falls. Like a real worker it stops generating once its response stream has
been ended by the web tier (its publish is refused) and records the aborts
it receives: the engine frees a request's KV blocks in ``abort``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from safety.selectors import policy_cache_forget
from tests.inference.conftest import (  # noqa: F401 (fixtures)
    DEMO,
    ScriptedWorker,
    auth,
    close_db_threads,
    demo_model,
    memory_bus,
)
from wire.events import EventType, created_event, delta_event, terminal_event, usage_body
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, WorkerState


@pytest.fixture(autouse=True)
def fresh_policies():
    policy_cache_forget()
    yield
    policy_cache_forget()


@dataclass
class TextWorker(ScriptedWorker):
    texts: list[str] = field(default_factory=list)
    # Seconds between deltas, so a cut lands while the worker still generates.
    pace: float = 0.0
    version: str = ""
    # Responses whose stream the web tier ended while this worker generated.
    closed_under_me: list[str] = field(default_factory=list)

    def _info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.worker_id,
            model=self.model,
            state=WorkerState.READY,
            version=self.version,
        )

    def _answer(self, request: GenerationRequest) -> None:
        rid, prompt = request.response_id, len(request.prompt_token_ids)
        self.bus.publish(
            rid,
            created_event(
                response_id=rid, model=self.model, worker_id=self.worker_id, prompt_tokens=prompt
            ),
        )
        for i, text in enumerate(self.texts):
            last = i == len(self.texts) - 1
            choice = {
                "index": 0,
                "text": text,
                "token_ids": [1000 + i],
                "logprobs": None,
                "finish_reason": "stop" if last else None,
            }
            if not self.bus.publish(rid, delta_event(i + 2, [choice])):
                self.closed_under_me.append(rid)
                return
            if self.pace:
                time.sleep(self.pace)
        usage = usage_body(prompt_tokens=prompt, completion_tokens=len(self.texts))
        event = terminal_event(
            EventType.COMPLETED, len(self.texts) + 2, usage=usage, finish_reasons={"0": "stop"}
        )
        self.bus.publish(rid, event)


@pytest.fixture
def text_worker(memory_bus) -> Callable[..., TextWorker]:  # noqa: F811
    started: list[TextWorker] = []

    def make(texts: list[str], **kwargs: Any) -> TextWorker:
        worker = TextWorker(texts=texts, **kwargs).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


__all__ = ["DEMO", "TextWorker", "auth"]
