"""A client population for fleet tests: requests through the real dispatch path.

Each request is dispatched by ``inference.relay.dispatch.dispatch_request`` (so
routing follows the published snapshot), read to its terminal event and
recorded as a UsageRecord with the worker's version, as the API's relay
does. Runs in its own thread and event loop until stopped.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from billing.services import usage_record_create
from inference.relay.dispatch import dispatch_request, wait_for_terminal
from wire.bus import Bus
from wire.events import EventType, Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.usage import UsageTag, usage_entry


@dataclass
class Traffic:
    bus: Bus
    model: str
    tenant_id: int
    prompt: list[int]
    concurrency: int = 3
    # The tenant opted in to shadow comparisons (Tenant.shadow_opt_in).
    shadow_allowed: bool = False
    # (version, terminal type, worker id) per finished request, in order.
    results: list[tuple[str, str, str]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def since(self, index: int) -> list[tuple[str, str, str]]:
        return self.results[index:]

    async def _run(self) -> None:
        await asyncio.gather(*(self._client(c) for c in range(self.concurrency)))

    async def _client(self, client: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                await self.one(f"conversation-{client}-{n}")
            except Exception as exc:  # surfaced by the test's assertions
                self.errors.append(exc)
                await asyncio.sleep(0.1)

    async def one(self, conversation: str) -> None:
        request = GenerationRequest(
            response_id=f"fleet-{uuid.uuid4().hex}",
            model=self.model,
            prompt_token_ids=self.prompt,
            sampling=Sampling(max_tokens=2, temperature=0.0),
            tier="pro",
            tenant_id=self.tenant_id,
        )
        worker = await dispatch_request(
            request, bus=self.bus, routing_key=conversation, shadow_allowed=self.shadow_allowed
        )
        terminal = await wait_for_terminal(
            request.response_id, worker_id=worker.worker_id, bus=self.bus, timeout=60
        )
        ending = terminal or Terminal(EventType.FAILED, 0)
        now = time.time()
        entry = usage_entry(
            response_id=request.response_id,
            tenant_id=self.tenant_id,
            model=self.model,
            tag=UsageTag(source="api"),
            terminal=ending,
            created_at=request.created_at,
            finished_at=now,
            worker_id=worker.worker_id,
            model_version=worker.version,
        )
        # Thread-sensitive: one thread, one pooled connection, however many requests.
        await sync_to_async(usage_record_create)(entry=entry)
        self.results.append((worker.version, ending.type.value, worker.worker_id))
