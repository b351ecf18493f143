"""The load driver of bench/fairness.py: seeded requests on the Redis bus.

Talks to one worker straight through ``wire.bus`` (no HTTP, no web
tier): what is measured is the engine's scheduler. TTFT is client-side,
from just before the request is put on the worker's stream to the first
delta carrying a token. Every loop here is bounded by a count or a
deadline, and every request still open at the end is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from wire.bus.redis_bus import WORKERS_KEY, RedisBus
from wire.events import Delta, Event, Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling

TIER_PRIORITY = {"free": 0, "pro": 1}


@dataclass(slots=True, frozen=True)
class LoadShape:
    free_outstanding: int = 12  # free requests kept in flight (closed loop)
    free_prompt: tuple[int, int] = (64, 128)
    free_out: tuple[int, int] = (192, 256)
    pro_prompt: tuple[int, int] = (32, 64)
    pro_out: int = 16
    pro_interval_s: float = 0.75
    window_s: float = 60.0  # pro trickle length; free tok/s measured over it
    ramp_s: float = 20.0  # longest wait for the flood to fill the engine
    grace_s: float = 60.0  # longest wait for the last pro requests after it
    idle_requests: int = 10


@dataclass(slots=True)
class Record:
    tier: str
    prompt_tokens: int
    max_tokens: int
    submitted: float = 0.0
    first_token: float | None = None
    ended: float | None = None
    end_type: str | None = None
    tokens: int = 0
    server_ttft_ms: float | None = None

    def ttft_ms(self) -> float | None:
        if self.first_token is None:
            return None
        return (self.first_token - self.submitted) * 1000


@dataclass(slots=True)
class Phase:
    records: list[Record] = field(default_factory=list)
    # (monotonic time, tier, tokens) per delta event, for tokens/s windows.
    deltas: list[tuple[float, str, int]] = field(default_factory=list)
    heartbeats: list[dict] = field(default_factory=list)


class Driver:
    """Submits requests to one worker and records what comes back."""

    def __init__(self, url: str, worker_id: str, model: str, token_ids: list[int], seed: int):
        self.url = url
        self.worker_id = worker_id
        self.model = model
        self.token_ids = token_ids
        self.rng = random.Random(seed)
        self.bus = RedisBus(url, response_ttl=120, heartbeat_ttl=6)
        self.redis = aioredis.Redis.from_url(url, decode_responses=True)
        self.open: dict[str, Record] = {}

    async def close(self) -> None:
        await self.abort_all()
        await self.bus.close()
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    def _prompt(self, bounds: tuple[int, int]) -> list[int]:
        return [self.rng.choice(self.token_ids) for _ in range(self.rng.randint(*bounds))]

    async def worker_info(self) -> dict | None:
        raw = await self.redis.hget(WORKERS_KEY, self.worker_id)
        return json.loads(raw) if raw else None

    async def request(self, phase: Phase, tier: str, prompt: list[int], max_tokens: int) -> Record:
        """One request, from submit to its terminal event (or abort)."""
        record = Record(tier, len(prompt), max_tokens)
        phase.records.append(record)
        response_id = f"bench-{uuid.uuid4().hex}"
        request = GenerationRequest(
            response_id=response_id,
            model=self.model,
            prompt_token_ids=prompt,
            sampling=Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
            priority=TIER_PRIORITY[tier],
            tier=tier,
        )
        self.open[response_id] = record
        record.submitted = time.monotonic()
        try:
            await self.bus.submit(self.worker_id, request)
            seq = 0
            while record.ended is None:
                for event in await self.bus.read_events(response_id, seq, 1000):
                    seq = event.seq
                    self._on_event(phase, record, event)
        finally:
            self.open.pop(response_id, None)
        return record

    def _on_event(self, phase: Phase, record: Record, event: Event) -> None:
        now = time.monotonic()
        if isinstance(event, Delta):
            count = sum(len(c.token_ids) for c in event.choices)
            if count and record.first_token is None:
                record.first_token = now
            record.tokens += count
            phase.deltas.append((now, record.tier, count))
        elif isinstance(event, Terminal):
            record.ended = now
            record.end_type = event.type.value
            record.server_ttft_ms = event.metrics.ttft_ms

    async def abort_all(self) -> None:
        for response_id in list(self.open):
            with contextlib.suppress(Exception):
                await self.bus.request_abort(self.worker_id, response_id)

    async def idle_baseline(self, shape: LoadShape) -> Phase:
        """Pro requests one at a time on an otherwise idle worker."""
        phase = Phase()
        for _ in range(shape.idle_requests):
            prompt = self._prompt(shape.pro_prompt)
            await asyncio.wait_for(self.request(phase, "pro", prompt, shape.pro_out), 60)
        return phase

    async def _sample(self, phase: Phase, stop: asyncio.Event) -> None:
        while not stop.is_set():
            info = await self.worker_info()
            if info:
                extra = info.get("extra", {})
                phase.heartbeats.append(
                    {
                        "t": time.monotonic(),
                        "kv_used": info["kv_blocks_used"],
                        "kv_total": info["kv_blocks_total"],
                        "running": info["running"],
                        "waiting": info["waiting"],
                        "swapped": info["swapped"],
                        "preemptions": extra.get("preemptions", 0),
                        "swaps_out": extra.get("swaps_out", 0),
                        "recomputes": extra.get("recomputes", 0),
                        "generated_tokens": extra.get("generated_tokens", 0),
                    }
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def _free_flood(self, phase: Phase, shape: LoadShape, stop: asyncio.Event) -> None:
        """Keep ``free_outstanding`` long free requests in flight until stopped."""
        tasks: set[asyncio.Task] = set()
        while not stop.is_set():
            while len(tasks) < shape.free_outstanding:
                prompt = self._prompt(shape.free_prompt)
                max_tokens = self.rng.randint(*shape.free_out)
                tasks.add(asyncio.create_task(self.request(phase, "free", prompt, max_tokens)))
            done, tasks = await asyncio.wait(tasks, timeout=0.25)
            for task in done:
                task.result()  # a driver error must not pass silently
        await self.abort_all()
        await asyncio.wait(tasks, timeout=15)
        for task in tasks:
            task.cancel()

    async def loaded(self, shape: LoadShape, progress) -> tuple[Phase, dict]:
        """The free flood with the pro trickle on top; returns the phase and its marks."""
        phase = Phase()
        stop_flood, stop_sampler = asyncio.Event(), asyncio.Event()
        sampler = asyncio.create_task(self._sample(phase, stop_sampler))
        flood = asyncio.create_task(self._free_flood(phase, shape, stop_flood))
        marks: dict = {"start": time.monotonic()}
        pro: list[asyncio.Task] = []
        try:
            ramp_end = marks["start"] + shape.ramp_s
            while time.monotonic() < ramp_end:
                beat = phase.heartbeats[-1] if phase.heartbeats else None
                # Full: the engine holds back part of the flood (a queue formed).
                if beat and beat["running"] and beat["waiting"]:
                    break
                await asyncio.sleep(0.25)
            marks["window_start"] = time.monotonic()
            progress(
                f"engine full (free requests queued) after {marks['window_start'] - marks['start']:.1f}s"
            )
            count = int(shape.window_s / shape.pro_interval_s)
            for index in range(count):
                at = marks["window_start"] + index * shape.pro_interval_s
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                prompt = self._prompt(shape.pro_prompt)
                pro.append(asyncio.create_task(self.request(phase, "pro", prompt, shape.pro_out)))
            marks["window_end"] = max(time.monotonic(), marks["window_start"] + shape.window_s)
            await asyncio.sleep(max(0.0, marks["window_end"] - time.monotonic()))
            _, pending = await asyncio.wait(pro, timeout=shape.grace_s)
            marks["pro_pending_after_grace"] = len(pending)
            marks["end"] = time.monotonic()
            await asyncio.sleep(1.2)  # one more heartbeat with the final counters
        finally:
            stop_flood.set()
            await asyncio.wait([flood], timeout=30)
            stop_sampler.set()
            await asyncio.wait([sampler], timeout=5)
            await self.abort_all()
            for task in [flood, sampler, *pro]:
                task.cancel()
        return phase, marks
