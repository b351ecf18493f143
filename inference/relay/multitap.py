"""Several responses read as one: a completions request with many prompts.

Each prompt is a response of its own (its own id, worker, usage record and
limits); ``MultiTap`` merges their events into the stream of one response
with ``len(taps) * n`` choices, so the relay and the formatters see one
stream in the bus contract's shape: one ``Created``, deltas whose choice
indices are offset by ``prompt_index * n``, then one ``Terminal`` once
every response has ended, with the usage summed. The first failure ends
the merged stream and abandons the others (their taps still record what
they used).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from inference.relay.tap import ResponseRoute, ResponseTap, spawn
from wire.codec import prompt_logprobs_json
from wire.events import Created, Delta, Event, EventType, PromptLogprobs, Terminal, TokenUsage


class MultiTap:
    """Reads like a ResponseTap (``next_event``, ``abandon``, ``route``, ``headers``)."""

    __slots__ = ("route", "headers", "_taps", "_n", "_queue", "_pumps", "_seq", "_ends", "_prompt")

    def __init__(self, taps: list[ResponseTap], *, n: int):
        self._taps = taps
        self._n = n
        first = taps[0].route
        self.route: ResponseRoute = replace(first, n=n * len(taps))
        # The last admission's rate-limit headers are the most current.
        self.headers = dict(taps[-1].headers)
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self._seq = 0
        self._ends: dict[int, Terminal] = {}
        self._prompt: dict[int, PromptLogprobs] = {}
        self._pumps = [spawn(self._pump(i, tap)) for i, tap in enumerate(taps)]

    async def _pump(self, index: int, tap: ResponseTap) -> None:
        while True:
            event = await tap.next_event()
            self._queue.put_nowait((index, event))
            if isinstance(event, Terminal):
                return

    async def next_event(self, timeout: float | None = None) -> Event | None:
        """The next merged event, or None when ``timeout`` passes first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                index, event = await asyncio.wait_for(self._queue.get(), remaining)
            except TimeoutError:
                return None
            merged = self._merge(index, event)
            if merged is not None:
                return merged

    def _merge(self, index: int, event: Event) -> Event | None:
        if isinstance(event, Created):
            if self._seq:
                return None
            return replace(event, response_id=self.route.response_id, seq=self._next())
        if isinstance(event, Delta):
            # Choice indices as OpenAI numbers them: prompt_index * n + j.
            offset = index * self._n
            choices = tuple(replace(c, index=c.index + offset) for c in event.choices)
            if event.prompt_logprobs is not None:
                self._prompt[index] = event.prompt_logprobs
            return replace(event, seq=self._next(), choices=choices)
        self._ends[index] = event
        if event.type in (EventType.FAILED, EventType.CANCELLED):
            self.abandon()
            return replace(event, seq=self._next())
        if len(self._ends) < len(self._taps):
            return None
        return self._combined()

    def _combined(self) -> Terminal:
        ends = [self._ends[i] for i in range(len(self._taps))]
        usage = TokenUsage()
        reasons: dict[int, str] = {}
        for i, end in enumerate(ends):
            usage += end.usage
            for choice, reason in end.finish_reasons.items():
                reasons[choice + i * self._n] = reason
        incomplete = any(e.type == EventType.INCOMPLETE for e in ends)
        kind = EventType.INCOMPLETE if incomplete else EventType.COMPLETED
        return Terminal(kind, self._next(), usage, ends[0].metrics, reasons)

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def prompt_logprobs(self) -> list[list[dict[str, dict[str, Any]] | None] | None]:
        """Per prompt, its prompt logprobs (vLLM's shape), in prompt order."""
        return [
            prompt_logprobs_json(self._prompt[i]) if i in self._prompt else None
            for i in range(len(self._taps))
        ]

    def abandon(self) -> None:
        """The client left (or one prompt failed): end every response still running."""
        for tap in self._taps:
            tap.abandon()
