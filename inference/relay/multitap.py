"""Several responses read as one: a completions request with many prompts.

Each prompt is a response of its own (its own id, worker, usage record and
limits); ``MultiTap`` merges their events into the stream of one response
with ``len(taps) * n`` choices, so the relay and the formatters see one
stream in the bus contract's shape: one ``created``, deltas whose choice
indices are offset by ``prompt_index * n`` (and say their ``prompt_index``),
then one terminal event once every response has ended, with the usage
summed. The first failure ends the merged stream and abandons the others
(their taps still record what they used).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from inference.relay.tap import ResponseRoute, ResponseTap, spawn
from wire.events import TERMINAL_EVENTS, EventType, usage_body


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
        self._queue: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
        self._seq = 0
        self._ends: dict[int, dict[str, Any]] = {}
        self._prompt: dict[int, list | None] = {}
        self._pumps = [spawn(self._pump(i, tap)) for i, tap in enumerate(taps)]

    async def _pump(self, index: int, tap: ResponseTap) -> None:
        while True:
            event = await tap.next_event()
            self._queue.put_nowait((index, event))
            if event["type"] in TERMINAL_EVENTS:
                return

    async def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
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

    def _merge(self, index: int, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event["type"]
        if kind == EventType.CREATED:
            if self._seq:
                return None
            return self._next({**event, "response_id": self.route.response_id})
        if kind == EventType.DELTA:
            offset = index * self._n
            choices = [
                {**c, "index": c["index"] + offset, "prompt_index": index} for c in event["choices"]
            ]
            merged = {**event, "choices": choices}
            if "prompt_logprobs" in event:
                self._prompt[index] = event["prompt_logprobs"]
                merged["prompt_logprobs_of"] = {index: merged.pop("prompt_logprobs")}
            return self._next(merged)
        self._ends[index] = event
        if kind in (EventType.FAILED, EventType.CANCELLED):
            self.abandon()
            return self._next(dict(event))
        if len(self._ends) < len(self._taps):
            return None
        return self._next(self._combined())

    def _combined(self) -> dict[str, Any]:
        ends = [self._ends[i] for i in range(len(self._taps))]
        usage = usage_body()
        reasons: dict[str, str] = {}
        for i, end in enumerate(ends):
            for key in usage:
                usage[key] += int((end.get("usage") or {}).get(key) or 0)
            for choice, reason in (end.get("finish_reasons") or {}).items():
                reasons[str(int(choice) + i * self._n)] = reason
        incomplete = any(e["type"] == EventType.INCOMPLETE for e in ends)
        return {
            "type": EventType.INCOMPLETE.value if incomplete else EventType.COMPLETED.value,
            "usage": usage,
            "metrics": ends[0].get("metrics") or {},
            "finish_reasons": reasons,
        }

    def _next(self, event: dict[str, Any]) -> dict[str, Any]:
        self._seq += 1
        event["seq"] = self._seq
        return event

    def prompt_logprobs(self) -> list:
        """Per prompt, its prompt logprobs (vLLM's shape), in prompt order."""
        return [self._prompt.get(i) for i in range(len(self._taps))]

    def abandon(self) -> None:
        """The client left (or one prompt failed): end every response still running."""
        for tap in self._taps:
            tap.abandon()
