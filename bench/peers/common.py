"""Helpers shared by the peer runners: arguments, progress, timing, summaries.

Standard library only: vLLM's runner imports this module from vLLM's own
virtualenv, which has neither this project's packages nor its pins.

Every step-driven peer (this engine, vLLM's LLMEngine) is wrapped in a
``StepAdapter`` and driven by the same loop, so both are timed the same way:
a token's time is when ``step()`` returned it, TTFT runs from ``add_request``
to the first token, and TPOT (time per output token, vLLM's benchmark
definition) is a request's time from its first token to its last divided
by its other tokens. The inter-token latency (the gap between consecutive
tokens) is kept too, but a step that returns several tokens of one
request (speculation) gives gaps of 0, so it is no figure to compare.

A runner started with ``--serve`` loads its model once and then runs one
timed round per command line on stdin (``serve``); bench/pairs.py keeps
such processes for a whole run instead of paying vLLM's compile warm-up
for every round.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


def progress(peer: str, message: str) -> None:
    print(f"[bench:{peer}] {message}", file=sys.stderr, flush=True)


def runner_args(description: str) -> argparse.Namespace:
    """The command line every runner takes from bench/engine.py."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--phases", default="offline,multiturn")
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    # JSON object of extra LLMEngine.from_pretrained options (engine runner).
    parser.add_argument("--engine-options", default="{}")
    # vLLM runner: its compiled mode (torch.compile and CPU graphs) instead of eager.
    parser.add_argument("--vllm-compiled", type=int, default=0)
    # vLLM runner: "ngram" turns its prompt-lookup speculative decoding on.
    parser.add_argument("--vllm-speculative", default="")
    # Load once, then one round per command on stdin (see ``serve``).
    parser.add_argument("--serve", action="store_true")
    return parser.parse_args()


def write_result(path: Path, result: dict) -> None:
    path.write_text(json.dumps(result, indent=1))


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(seconds: list[float]) -> dict:
    """p50/p99/mean in milliseconds, and how many samples they stand on."""
    if not seconds:
        return {"p50_ms": None, "p99_ms": None, "mean_ms": None, "n": 0}
    return {
        "p50_ms": round(percentile(seconds, 50) * 1000, 2),
        "p99_ms": round(percentile(seconds, 99) * 1000, 2),
        "mean_ms": round(sum(seconds) / len(seconds) * 1000, 2),
        "n": len(seconds),
    }


def median_run(runs: list[dict]) -> dict:
    """The run whose output tokens/s is the median (the lower one for even N)."""
    ordered = sorted(runs, key=lambda r: r["tok_s"])
    return ordered[(len(ordered) - 1) // 2]


@dataclass(slots=True)
class StepEvent:
    """Tokens one request got from one step, and whether it ended there."""

    request_id: str
    token_ids: list[int]
    finished: bool
    num_cached_tokens: int | None = None


@dataclass(slots=True, frozen=True)
class Sampling:
    """What every request of a workload samples with (0.0: greedy)."""

    temperature: float = 0.0
    top_p: float = 1.0


GREEDY = Sampling()


class StepAdapter(Protocol):
    def add(
        self, request_id: str, prompt: list[int], max_tokens: int, salt: str, sampling: Sampling
    ) -> None: ...

    def step(self) -> list[StepEvent]: ...


@dataclass(slots=True)
class Track:
    """One request's clock: when it was submitted and when each token came."""

    prompt_len: int
    max_tokens: int
    submitted: float
    token_times: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    num_cached_tokens: int | None = None
    finished: float | None = None


# Called after every step with (seconds the step took, its events, tracks).
StepHook = Callable[[float, list[StepEvent], dict[str, Track]], None]
# Called when a request finishes; may submit follow-up requests.
FinishHook = Callable[[str, Track], None]


class Driver:
    """Runs a step-driven peer until every submitted request has finished."""

    def __init__(self, adapter: StepAdapter, *, salt: str, sampling: Sampling = GREEDY) -> None:
        self.adapter = adapter
        self.salt = salt
        self.sampling = sampling
        self.tracks: dict[str, Track] = {}
        self.pending: set[str] = set()
        self.steps = 0

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> None:
        self.tracks[request_id] = Track(len(prompt), max_tokens, time.perf_counter())
        self.pending.add(request_id)
        self.adapter.add(request_id, prompt, max_tokens, self.salt, self.sampling)

    def run(self, *, on_step: StepHook | None = None, on_finish: FinishHook | None = None):
        while self.pending:
            started = time.perf_counter()
            events = self.adapter.step()
            now = time.perf_counter()
            self.steps += 1
            for event in events:
                track = self.tracks[event.request_id]
                track.token_ids.extend(event.token_ids)
                track.token_times.extend([now] * len(event.token_ids))
                if event.num_cached_tokens is not None:
                    track.num_cached_tokens = event.num_cached_tokens
            if on_step is not None:
                on_step(now - started, events, self.tracks)
            for event in events:
                if event.finished:
                    track = self.tracks[event.request_id]
                    track.finished = now
                    self.pending.discard(event.request_id)
                    if on_finish is not None:
                        on_finish(event.request_id, track)

    def summary(self, started: float) -> dict:
        """Throughput and latency over every request this driver ran."""
        tracks = list(self.tracks.values())
        ended = max(t.finished for t in tracks)
        tokens = sum(len(t.token_ids) for t in tracks)
        ttft = [t.token_times[0] - t.submitted for t in tracks if t.token_times]
        itl = [b - a for t in tracks for a, b in itertools.pairwise(t.token_times)]
        tpot = [
            (t.token_times[-1] - t.token_times[0]) / (len(t.token_times) - 1)
            for t in tracks
            if len(t.token_times) > 1
        ]
        short = [t for t in tracks if len(t.token_ids) != t.max_tokens]
        cached = [t.num_cached_tokens for t in tracks if t.num_cached_tokens is not None]
        return {
            "requests": len(tracks),
            "output_tokens": tokens,
            "prompt_tokens": sum(t.prompt_len for t in tracks),
            "elapsed_s": round(ended - started, 3),
            "tok_s": round(tokens / (ended - started), 2),
            "ttft": latency_summary(ttft),
            "tpot": latency_summary(tpot),
            "itl": latency_summary(itl),
            "steps": self.steps,
            # ignore_eos should make this 0; anything else means the peer
            # stopped early and its tokens/s is not comparable.
            "requests_short_of_max_tokens": len(short),
            "prompt_tokens_cached": sum(cached) if cached else None,
        }


def workload_sampling(workload) -> Sampling:
    return Sampling(workload.temperature, workload.top_p)


def run_offline(adapter: StepAdapter, workload, *, salt: str, on_step=None) -> dict:
    """Submit every offline request at once and step until all are done."""
    driver = Driver(adapter, salt=salt, sampling=workload_sampling(workload))
    started = time.perf_counter()
    for request in workload.offline:
        driver.submit(request.request_id, request.prompt_token_ids, request.max_tokens)
    driver.run(on_step=on_step)
    return driver.summary(started)


def run_sequential(adapter: StepAdapter, workload, *, salt: str, on_step=None) -> dict:
    """The offline requests one at a time: each is sent when the last ends.

    A single stream: every step is a batch of one, so this measures the
    per-step cost that bounds one user's tokens/s.
    """
    driver = Driver(adapter, salt=salt, sampling=workload_sampling(workload))
    queue = list(workload.offline)

    def send_next(*_finished) -> None:
        if queue:
            request = queue.pop(0)
            driver.submit(request.request_id, request.prompt_token_ids, request.max_tokens)

    started = time.perf_counter()
    send_next()
    driver.run(on_step=on_step, on_finish=send_next)
    return driver.summary(started)


def run_multiturn(adapter: StepAdapter, workload, *, salt: str, on_step=None) -> dict:
    """All conversations at once; each next turn is sent when the last ends.

    Turn k's prompt is the system prompt, then every earlier user turn and
    the peer's own answer to it, then user turn k.
    """
    driver = Driver(adapter, salt=salt, sampling=workload_sampling(workload))
    history: dict[str, list[int]] = {}
    turn_of: dict[str, tuple[str, int]] = {}
    conversations = {c.conversation_id: c for c in workload.conversations}

    def send(conversation_id: str, turn: int) -> None:
        prompt = history[conversation_id] + conversations[conversation_id].user_turns[turn]
        history[conversation_id] = prompt
        request_id = f"{salt}-{conversation_id}-t{turn}"
        turn_of[request_id] = (conversation_id, turn)
        driver.submit(request_id, prompt, workload.turn_max_tokens)

    def on_finish(request_id: str, track: Track) -> None:
        conversation_id, turn = turn_of[request_id]
        history[conversation_id] = history[conversation_id] + track.token_ids
        if turn + 1 < len(conversations[conversation_id].user_turns):
            send(conversation_id, turn + 1)

    started = time.perf_counter()
    for conversation_id in conversations:
        history[conversation_id] = list(workload.system_prompt)
        send(conversation_id, 0)
    driver.run(on_step=on_step, on_finish=on_finish)
    result = driver.summary(started)
    result["prompt_tokens_sent"] = result["prompt_tokens"]
    return result


PHASES = {"offline": run_offline, "sequential": run_sequential, "multiturn": run_multiturn}


def warm_up(adapter: StepAdapter, workload, *, salt: str) -> None:
    """Two short requests (64 prompt tokens, 4 out) through the same loop,
    under their own cache salt so they leave nothing a timed run reuses."""
    driver = Driver(adapter, salt=f"warm-{salt}", sampling=workload_sampling(workload))
    for request in workload.offline[:2]:
        driver.submit(f"warm-{salt}-{request.request_id}", request.prompt_token_ids[:64], 4)
    driver.run()


# A line on stdout that starts with this carries a JSON reply to bench/pairs.py.
REPLY = "@@bench-pairs "


def reply(payload: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(payload) + "\n")
    sys.stdout.flush()


def serve(info: dict, run_round: Callable[[object, str, str], dict]) -> None:
    """Reply ``info``, then run one round per line on stdin until it closes.

    A line is ``{"workload": path, "phase": name, "salt": text}``; the reply
    is ``run_round(workload, phase, salt)``, or ``{"error": ...}`` when it
    raised (the process stays up for the next round).
    """
    from bench.workloads import Workload

    reply(info)
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        try:
            workload = Workload.from_json(Path(command["workload"]))
            result = run_round(workload, command["phase"], command["salt"])
        except Exception as error:  # noqa: BLE001 - reported to the caller, who records it
            result = {"error": f"{type(error).__name__}: {error}"}
        reply(result)


def set_thread_env(threads: int) -> None:
    """OpenMP/MKL thread counts, set before torch is imported."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(threads))
