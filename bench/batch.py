"""A batch alone and beside interactive traffic on the real topology, and the
same batch through the offline engine.

    python -m bench.batch [--lines 48] [--batch-max-tokens 32] [--rate 1.0]
        [--duration 20] [--max-tokens 16] [--batch-in-flight 256]
        [--out bench/results/batch.json]

The issue's run is ``--lines 2000``. Starts the load benchmark's topology
(``bench/load_topology.py``: a private redis-server, one ``gpuworker`` with
its metrics port, Daphne, on a PostgreSQL database of its own) plus a
Celery worker on the ``batches`` queue, with ``BATCH_MAX_IN_FLIGHT_PER_*``
at ``--batch-in-flight`` (256: above the feeder's own pacing bound, the
engine's 64 seats and 32 lines queued behind them, so the batch fills the
engine as the offline run does). Then:

1. interactive alone: one streaming chat completion every ``1/--rate``
   seconds for ``--duration`` seconds (``bench.load``'s client, with
   ``--max-tokens``); their TTFT p50 and p95, and their output tok/s (the
   worker's ``vllm:generation_tokens`` over the phase);
2. batch alone: ``--lines`` chat lines (``--batch-max-tokens`` each,
   ``ignore_eos``, seed = line number, through the openai SDK's
   ``files.create`` and ``batches.create``); its output tok/s from
   ``batches.create`` to ``completed`` (end to end: validation, feeding,
   the tail), and the worker's capacity: its generated tokens per second
   between 10% and 90% of the batch's tokens (the saturated middle);
3. mixed: the same batch again; once its lines flow, the interactive load
   of phase 1 for ``--duration`` s. Interactive TTFT with the batch, and
   the batch's tok/s in that window: the worker's tokens in it less the
   interactive streams' tokens in it (their token times, from the
   stream). Capacity used = batch tok/s mixed / (capacity - interactive
   tok/s alone);
4. offline: the topology stopped, ``LLMEngine.from_pretrained`` with the
   worker's dtype, KV cache, batched-token budget and thread count, and
   ``LLMEngine.generate`` on the same prompts (the model's chat template)
   and sampling; its output tok/s. Ratio = batch alone end to end /
   offline.

Goals (issue 29): interactive TTFT p95 under a running batch at most 1.2x
without it; the batch alone at least 0.9x the offline engine; capacity
used at least 70%. Figures to ``--out`` and a table to stdout; nothing here
asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import time
from pathlib import Path

import httpx

from bench import load
from bench.load_topology import (
    BENCH_SECRET_KEY,
    MODEL,
    ROOT,
    Topology,
    free_port,
    prepare_database,
)

QUESTIONS = [
    "Summarize the plot of a heist movie in two sentences.",
    "List four uses of a paperclip.",
    "Explain photosynthesis to a child.",
    "Write a limerick about a lighthouse.",
]


def progress(message: str) -> None:
    print(f"[batch] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lines", type=int, default=48)
    parser.add_argument("--batch-max-tokens", type=int, default=32)
    parser.add_argument("--rate", type=float, default=1.0, help="interactive streams per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--max-tokens", type=int, default=16, help="per interactive stream")
    parser.add_argument("--batch-timeout", type=float, default=120.0)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_batch")
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1, help="the worker's torch threads")
    parser.add_argument("--max-concurrent", type=int, default=256, help="the tier's cap")
    parser.add_argument(
        "--batch-in-flight",
        type=int,
        default=256,
        help="BATCH_MAX_IN_FLIGHT_PER_BATCH and _PER_TENANT: the caps; the feeder's "
        "pacing bound (batches/services/pacing.py: the worker's 64 seats and 32 queued) "
        "decides below them",
    )
    parser.add_argument("--skip-offline", action="store_true", help="no offline engine run")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "batch.json")
    args = parser.parse_args(argv)
    # bench.load's client reads these.
    args.deadline = 120.0
    return args


class BatchTopology(Topology):
    """The load topology and a Celery worker feeding batch lines; the
    worker's metrics port, for its generated-token counter."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.metrics_port = free_port()

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(
            WORKER_METRICS_PORT=str(self.metrics_port),
            BATCH_MAX_IN_FLIGHT_PER_BATCH=str(self.args.batch_in_flight),
            BATCH_MAX_IN_FLIGHT_PER_TENANT=str(self.args.batch_in_flight),
        )
        return env

    def generated_tokens(self) -> float:
        """The worker's ``vllm:generation_tokens`` counter (all models)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:generation_tokens_total")
        )

    def start(self) -> None:
        super().start()
        self._start(
            "celery",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config.celery_app",
                "worker",
                "-Q",
                "batches",
                "--pool",
                "threads",
                "--concurrency",
                "2",
                "-l",
                "warning",
            ],
        )


async def interactive(base_url: str, key: str, args) -> list[load.Client]:
    """One stream every 1/rate s for the phase; every stream awaited (the
    phase's end is when the last one was sent)."""
    clients: list[load.Client] = []
    tasks = []
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120, connect=30)) as http:
        url = f"{base_url}/chat/completions"
        started = time.monotonic()
        index = 0
        while time.monotonic() - started < args.duration:
            client = load.Client(index)
            clients.append(client)
            tasks.append(asyncio.create_task(load.run_client(http, url, key, client, args)))
            index += 1
            await asyncio.sleep(1 / args.rate)
        await asyncio.gather(*tasks)
    return clients


def ttft(clients: list[load.Client]) -> dict:
    values = [c.first_token - c.started for c in clients if c.first_token is not None]
    return {
        "streams": len(clients),
        "completed": sum(c.outcome == "completed" for c in clients),
        "ttft_p50_ms": load.ms(load.percentile(values, 50)),
        "ttft_p95_ms": load.ms(load.percentile(values, 95)),
    }


def token_times(client: load.Client) -> list[float]:
    """When each of the stream's tokens arrived: the first chunk's at its
    first token, each later one at its share of its chunk's gap."""
    if client.first_token is None:
        return []
    times = [client.first_token] * max(0, client.tokens - len(client.gaps))
    at = client.first_token
    for gap in client.gaps:
        at += gap
        times.append(at)
    return times


def tokens_between(clients: list[load.Client], start: float, end: float) -> int:
    return sum(start <= t <= end for c in clients for t in token_times(c))


def batch_lines(args) -> list[dict]:
    return [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                "max_tokens": args.batch_max_tokens,
                "ignore_eos": True,
                "seed": i,
            },
        }
        for i in range(args.lines)
    ]


def batch_file(args) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in batch_lines(args)).encode()


class Counter:
    """Samples the worker's generated-token counter every half second."""

    def __init__(self, topology: BatchTopology):
        self.topology = topology
        self.samples: list[tuple[float, float]] = []

    async def sample(self) -> float:
        value = await asyncio.to_thread(self.topology.generated_tokens)
        self.samples.append((time.monotonic(), value))
        return value

    def at(self, when: float) -> float:
        """The counter at ``when``, linear between the samples around it."""
        before = max((s for s in self.samples if s[0] <= when), default=self.samples[0])
        after = min((s for s in self.samples if s[0] >= when), default=self.samples[-1])
        if after[0] == before[0]:
            return before[1]
        share = (when - before[0]) / (after[0] - before[0])
        return before[1] + share * (after[1] - before[1])

    def steady_rate(self, start: float, total: float) -> float | None:
        """Tokens per second between 10% and 90% of ``total`` tokens counted
        from ``start`` (the counter's value when the phase began)."""
        low, high = self.reached(start, 0.1 * total), self.reached(start, 0.9 * total)
        if low is None or high is None or high <= low:
            return None
        return 0.8 * total / (high - low)

    def stopped(self) -> float | None:
        """When the counter took its last value (None before two samples)."""
        if len(self.samples) < 2:
            return None
        last = self.samples[-1][1]
        return next(t for t, v in self.samples if v == last)

    def reached(self, start: float, tokens: float) -> float | None:
        """When the counter first passed ``start + tokens`` (linear between
        samples); None if it never did."""
        goal = start + tokens
        for (t0, v0), (t1, v1) in zip(self.samples, self.samples[1:], strict=False):
            if v0 <= goal <= v1 and v1 > v0:
                return t0 + (goal - v0) / (v1 - v0) * (t1 - t0)
        return None


def phases(counter: Counter, start: float, total: float, seen: dict[str, float]) -> dict:
    """Where a batch's time went, in seconds from ``batches.create``:
    validate (until it was seen in_progress), ramp (until 10% of its tokens:
    claims, the request path, the first prefills), steady (10% to 90%), tail
    (90% to its last token: the last lines, fewer than fill the engine),
    finalize (last token until it was seen completed: the last lines'
    results, the output file). Status is polled every 0.5 s, so each edge
    is known to about that."""
    created = seen["created"]
    edges = {
        "in_progress": seen.get("in_progress"),
        "first_token": counter.reached(start, 1),
        "tokens_10": counter.reached(start, 0.1 * total),
        "tokens_90": counter.reached(start, 0.9 * total),
        # The worker's counter can trail the output file's usage by a few
        # tokens at the last sample: then when it stopped growing.
        "last_token": counter.reached(start, total) or counter.stopped(),
        "done": seen.get("done"),
    }
    if any(value is None for value in edges.values()):
        return {"edges_s": {k: v and round(v - created, 2) for k, v in edges.items()}}
    spans = {
        "validate": edges["in_progress"] - created,
        "ramp": edges["tokens_10"] - edges["in_progress"],
        "steady": edges["tokens_90"] - edges["tokens_10"],
        "tail": edges["last_token"] - edges["tokens_90"],
        "finalize": edges["done"] - edges["last_token"],
    }
    return {
        "edges_s": {k: round(v - created, 2) for k, v in edges.items()},
        "phases_s": {k: round(v, 2) for k, v in spans.items()},
        "steady_tok_per_s": round(0.8 * total / spans["steady"], 1) if spans["steady"] else None,
    }


async def run_batch(topology: BatchTopology, key: str, args, *, beside: bool) -> dict:
    """One batch of ``--lines``; ``beside``: with the interactive load
    started once its lines flow (phase 3), else alone (phase 2)."""
    import openai

    client = openai.AsyncOpenAI(api_key=key, base_url=topology.base_url, max_retries=0)
    counter = Counter(topology)
    upload = await client.files.create(
        file=("bench.jsonl", io.BytesIO(batch_file(args))), purpose="batch"
    )
    start_tokens = await counter.sample()
    created = time.monotonic()
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    streams: asyncio.Task | None = None
    window: list[float] = []
    seen = {"created": created}
    while True:
        batch = await client.batches.retrieve(batch.id)
        flowing = await counter.sample() > start_tokens
        finished = batch.status in ("completed", "failed", "expired", "cancelled")
        if batch.status != "validating":
            seen.setdefault("in_progress", time.monotonic())
        if finished:
            seen.setdefault("done", time.monotonic())
        if beside and streams is None and (flowing or finished):
            # The worker generates the batch's tokens: the window opens with
            # the interactive load.
            window.append(time.monotonic())
            streams = asyncio.create_task(interactive(topology.base_url, key, args))
        if streams is not None and len(window) == 1 and (streams.done() or finished):
            # Closes when the load's phase ends or the batch does, if sooner.
            window.append(time.monotonic())
        if finished:
            break
        if time.monotonic() - created > args.batch_timeout:
            await client.batches.cancel(batch.id)
        await asyncio.sleep(0.5)
    elapsed = time.monotonic() - created
    clients = await streams if streams is not None else []
    tokens = prompt_tokens = 0
    if batch.output_file_id:
        content = (await client.files.content(batch.output_file_id)).content
        for line in content.decode().splitlines():
            usage = json.loads(line)["response"]["body"]["usage"]
            tokens += usage["completion_tokens"]
            prompt_tokens += usage["prompt_tokens"]
    figures = {
        "id": batch.id,
        "status": batch.status,
        "lines": args.lines,
        "completed": batch.request_counts.completed,
        "failed": batch.request_counts.failed,
        "seconds": round(elapsed, 2),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": tokens,
        "output_tok_per_s": round(tokens / elapsed, 1) if elapsed else None,
    }
    if not beside:
        rate = counter.steady_rate(start_tokens, tokens)
        figures["worker_capacity_tok_per_s"] = round(rate, 1) if rate else None
        figures["breakdown"] = phases(counter, start_tokens, tokens, seen)
    else:
        opened, closed = window
        worker = counter.at(closed) - counter.at(opened)
        theirs = tokens_between(clients, opened, closed)
        figures.update(
            window_seconds=round(closed - opened, 2),
            window_worker_tokens=round(worker),
            window_interactive_tokens=theirs,
            batch_tok_per_s_in_window=round((worker - theirs) / (closed - opened), 1),
            window_closed_by="batch end" if closed - opened < args.duration else "load end",
            interactive=clients,
        )
    return figures


def offline(args) -> dict:
    """The same lines through ``LLMEngine.generate``, as the worker loads it."""
    # The settings the worker ran with (the topology's local mode).
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_ENV", "local")
    os.environ.setdefault("DJANGO_SECRET_KEY", BENCH_SECRET_KEY)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import django

    django.setup()
    import torch
    from django.conf import settings
    from transformers import AutoTokenizer

    from gpuworkers.engine import LLMEngine, SamplingParams
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    directory = ensure_demo_model()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    engine = LLMEngine.from_pretrained(
        directory,
        dtype=settings.ENGINE_DTYPE,
        kv_cache_bytes=args.kv_cache_mb << 20,
        max_num_batched_tokens=settings.ENGINE_MAX_BATCHED_TOKENS,
        num_threads=args.threads,
    )
    engine.warmup()
    prompts, params = [], []
    for line in batch_lines(args):
        body = line["body"]
        rendered = tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(rendered, add_special_tokens=False))
        params.append(
            SamplingParams(max_tokens=body["max_tokens"], ignore_eos=True, seed=body["seed"])
        )
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    tokens = sum(len(c.token_ids) for out in outputs for c in out.choices)
    return {
        "threads": torch.get_num_threads(),
        "prompt_tokens": sum(len(p) for p in prompts),
        "completion_tokens": tokens,
        "seconds": round(seconds, 2),
        "output_tok_per_s": round(tokens / seconds, 1),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 2) if numerator and denominator else None


def interactive_phase(topology: BatchTopology, key: str, args) -> tuple[dict, float]:
    """Phase 1: the load alone; its TTFT and the worker's tok/s over it."""

    async def run() -> tuple[list[load.Client], float]:
        counter = Counter(topology)
        await counter.sample()
        clients = await interactive(topology.base_url, key, args)
        await counter.sample()
        (t0, v0), (t1, v1) = counter.samples
        return clients, (v1 - v0) / (t1 - t0)

    clients, rate = asyncio.run(run())
    return ttft(clients), rate


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    topology = BatchTopology(args)
    load_before = os.getloadavg()
    try:
        progress(f"starting redis-server, gpuworker, Daphne and Celery (logs in {topology.logs})")
        key = prepare_database(topology)
        topology.start()
        warm = httpx.post(
            f"{topology.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        warm.raise_for_status()
        progress(f"1. interactive alone: {args.rate}/s for {args.duration} s")
        alone, interactive_rate = interactive_phase(topology, key, args)
        progress(f"2. a batch of {args.lines} lines alone")
        batch_alone = asyncio.run(run_batch(topology, key, args, beside=False))
        progress(f"3. a batch of {args.lines} lines with the interactive load")
        mixed = asyncio.run(run_batch(topology, key, args, beside=True))
        beside = ttft(mixed.pop("interactive"))
    finally:
        progress("stopping the topology")
        topology.stop()
    engine = None
    if not args.skip_offline:
        progress(f"4. the same {args.lines} lines through LLMEngine.generate")
        engine = offline(args)
    from bench.peers.launch import machine_info

    capacity = batch_alone["worker_capacity_tok_per_s"]
    left = capacity - interactive_rate if capacity else None
    result = {
        "command": "python -m bench.batch " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "interactive_alone": {**alone, "output_tok_per_s": round(interactive_rate, 1)},
        "interactive_with_batch": beside,
        "ttft_p95_ratio": ratio(beside["ttft_p95_ms"], alone["ttft_p95_ms"]),
        "batch_alone": batch_alone,
        "batch_with_interactive": mixed,
        "offline_engine": engine,
        "batch_vs_offline_ratio": ratio(
            batch_alone["output_tok_per_s"], engine and engine["output_tok_per_s"]
        ),
        "batch_vs_offline_ratio_steady": ratio(capacity, engine and engine["output_tok_per_s"]),
        "capacity_left_tok_per_s": round(left, 1) if left else None,
        "capacity_used": ratio(mixed["batch_tok_per_s_in_window"], left),
        "machine": machine_info(load_before),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':28}{'streams':>8}{'TTFT p50 ms':>13}{'TTFT p95 ms':>13}")
    for name, row in (("interactive alone", alone), ("interactive + batch", beside)):
        print(
            f"{name:28}{row['streams']:>8}{row['ttft_p50_ms'] or '-':>13}{row['ttft_p95_ms'] or '-':>13}"
        )
    print(f"TTFT p95 with/without the batch: {result['ttft_p95_ratio']} (goal <= 1.2)")
    print(
        f"batch alone: {batch_alone['completed']}/{batch_alone['lines']} lines in "
        f"{batch_alone['seconds']} s, {batch_alone['output_tok_per_s']} output tok/s end to end; "
        f"worker capacity (10-90% of its tokens) {capacity} tok/s"
    )
    if engine is not None:
        print(
            f"offline LLMEngine.generate: {engine['output_tok_per_s']} tok/s "
            f"({engine['seconds']} s, {engine['threads']} threads); batch/offline "
            f"{result['batch_vs_offline_ratio']} end to end, "
            f"{result['batch_vs_offline_ratio_steady']} steady (goal >= 0.9)"
        )
    print(
        f"interactive alone: {result['interactive_alone']['output_tok_per_s']} tok/s; "
        f"capacity left {result['capacity_left_tok_per_s']} tok/s; batch beside it "
        f"{mixed['batch_tok_per_s_in_window']} tok/s over {mixed['window_seconds']} s "
        f"({mixed['window_closed_by']}): capacity used {result['capacity_used']} (goal >= 0.7)"
    )
    la = result["machine"]
    print(f"load average before {la['loadavg_before']}, after {la['loadavg_after']}")
    progress(f"figures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
