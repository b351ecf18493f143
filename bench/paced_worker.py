"""A synthetic serving worker for bench.safety: the real bus, a fixed decode step.

    python -m bench.paced_worker --redis-url URL --worker-id ID [--step-ms 20]

It registers READY on the Redis bus as a ``gpuworker`` does and answers
every request with ``max_tokens`` deltas: one token per running request
per step of ``--step-ms``, all of a step's events in one pipeline
(``publish_many``), then a ``completed`` ending. Aborts end a request at
once with ``cancelled``. The tokens are the words of an ordinary English
passage, so output moderation judges real text. A GPU-like, steady step
makes the web tier's own cost per token measurable: a model on two shared
CPU cores would bury a 5% difference in its noise.
"""

from __future__ import annotations

import argparse
import signal
import time
from dataclasses import dataclass

from wire.bus.redis_bus import RedisWorkerBus
from wire.events import (
    ChoiceDelta,
    Created,
    Delta,
    Event,
    EventType,
    Terminal,
    Timings,
    TokenUsage,
)
from wire.workers import WorkerInfo, WorkerState

PASSAGE = (
    "The river ran slowly past the old mill, and the children walked along its bank "
    "collecting smooth stones. Their grandmother told them stories about the winters "
    "when the water froze solid and the whole village skated from one farm to the next. "
    "In the evening they sat by the fire, counted their stones and planned the next walk, "
    "while the wind moved through the tall grass and the first stars came out above the hills."
)
WORDS = PASSAGE.split(" ")
TOKENS = [WORDS[0]] + [" " + word for word in WORDS[1:]]


@dataclass(slots=True)
class _Running:
    seq: int
    sent: int
    max_tokens: int
    prompt_tokens: int
    created_at: float
    first_at: float | None = None


def serve(bus: RedisWorkerBus, worker_id: str, model: str, step: float) -> None:
    info = WorkerInfo(worker_id=worker_id, model=model, state=WorkerState.READY)
    bus.register(info)
    running: dict[str, _Running] = {}
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    next_step, beat = time.monotonic(), 0.0
    while not stop:
        now = time.monotonic()
        # More often than the liveness TTL (wire.bus.base.LIVENESS_TTL).
        if now - beat >= 0.3:
            info.running = len(running)
            bus.heartbeat(info)
            beat = now
        requests, aborts = bus.poll(worker_id, max(1, int((next_step - now) * 1000)))
        for r in requests:
            created = Created(
                response_id=r.response_id,
                model=model,
                worker_id=worker_id,
                prompt_tokens=len(r.prompt_token_ids),
            )
            bus.publish(r.response_id, created)
            running[r.response_id] = _Running(
                1, 0, int(r.sampling.max_tokens or 16), len(r.prompt_token_ids), r.created_at
            )
        for rid in aborts:
            state = running.pop(rid, None)
            if state is not None:
                usage = TokenUsage(state.prompt_tokens, state.sent)
                bus.publish(rid, Terminal(EventType.CANCELLED, state.seq + 1, usage=usage))
        if time.monotonic() < next_step:
            continue
        bus.publish_many(_step(running))
        next_step += step
        if next_step < time.monotonic():
            next_step = time.monotonic() + step
    bus.deregister(worker_id)


def _step(running: dict[str, _Running]) -> list[tuple[str, Event]]:
    batch: list[tuple[str, Event]] = []
    for rid, state in list(running.items()):
        state.seq += 1
        last = state.sent + 1 >= state.max_tokens
        choice = ChoiceDelta(
            0,
            TOKENS[state.sent % len(TOKENS)],
            (state.sent,),
            finish_reason="length" if last else None,
        )
        state.sent += 1
        state.first_at = state.first_at or time.time()
        batch.append((rid, Delta(state.seq, (choice,))))
        if last:
            del running[rid]
            metrics = Timings(
                queue_time_ms=0.0,
                ttft_ms=(state.first_at - state.created_at) * 1000,
                duration_ms=(time.time() - state.created_at) * 1000,
            )
            usage = TokenUsage(state.prompt_tokens, state.sent)
            ending = Terminal(
                EventType.COMPLETED,
                state.seq + 1,
                usage=usage,
                metrics=metrics,
                finish_reasons={0: "length"},
            )
            batch.append((rid, ending))
    return batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paced_worker")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    serve(RedisWorkerBus(args.redis_url), args.worker_id, args.model, args.step_ms / 1000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
