"""A batch alongside interactive traffic on the real topology.

    python -m bench.batch [--lines 48] [--batch-max-tokens 32] [--rate 1.0]
        [--duration 20] [--max-tokens 16] [--out bench/results/batch.json]

Starts the load benchmark's topology (``bench/load_topology.py``: a
private redis-server, one ``gpuworker``, Daphne, on a PostgreSQL database
of its own) plus a Celery worker on the ``batches`` queue. Then:

1. interactive only: one streaming chat completion every ``1/--rate``
   seconds for ``--duration`` seconds (``bench.load``'s client, with
   ``--max-tokens``); their TTFT p50 and p95;
2. the same interactive load again while a batch of ``--lines`` chat lines
   (``--batch-max-tokens`` each, through the openai SDK's ``files.create``
   and ``batches.create``) runs; their TTFT with the batch, and the batch's
   output tokens per second (its lines' completion tokens over the time
   from ``batches.create`` to ``completed``, polled every half second).

The goal (issue 29): interactive TTFT p95 under a running batch at most
1.2x without it. Figures to ``--out`` and a table to stdout; nothing here
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
from bench.load_topology import MODEL, ROOT, Topology, prepare_database

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
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "batch.json")
    args = parser.parse_args(argv)
    # bench.load's client reads these.
    args.deadline = 120.0
    return args


class BatchTopology(Topology):
    """The load topology and a Celery worker feeding batch lines."""

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
    """One stream every 1/rate s for the phase; every stream awaited."""
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


def batch_file(args) -> bytes:
    lines = [
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
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


async def with_batch(base_url: str, key: str, args) -> tuple[list[load.Client], dict]:
    import openai

    client = openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=0)
    upload = await client.files.create(
        file=("bench.jsonl", io.BytesIO(batch_file(args))), purpose="batch"
    )
    created = time.monotonic()
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    streams = asyncio.create_task(interactive(base_url, key, args))
    done_at_phase_end = None
    while True:
        batch = await client.batches.retrieve(batch.id)
        if streams.done() and done_at_phase_end is None:
            done_at_phase_end = batch.request_counts.completed
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            break
        if time.monotonic() - created > args.batch_timeout:
            await client.batches.cancel(batch.id)
        await asyncio.sleep(0.5)
    elapsed = time.monotonic() - created
    clients = await streams
    if done_at_phase_end is None:
        done_at_phase_end = batch.request_counts.completed
    tokens = 0
    if batch.output_file_id:
        content = (await client.files.content(batch.output_file_id)).content
        for line in content.decode().splitlines():
            tokens += json.loads(line)["response"]["body"]["usage"]["completion_tokens"]
    figures = {
        "id": batch.id,
        "status": batch.status,
        "lines": args.lines,
        "completed": batch.request_counts.completed,
        "failed": batch.request_counts.failed,
        "lines_done_when_interactive_phase_ended": done_at_phase_end,
        "seconds": round(elapsed, 2),
        "completion_tokens": tokens,
        "output_tok_per_s": round(tokens / elapsed, 1) if elapsed else None,
    }
    return clients, figures


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
        progress(f"interactive only: {args.rate}/s for {args.duration} s")
        alone = ttft(asyncio.run(interactive(topology.base_url, key, args)))
        progress(f"the same with a batch of {args.lines} lines running")
        clients, batch = asyncio.run(with_batch(topology.base_url, key, args))
        beside = ttft(clients)
    finally:
        progress("stopping the topology")
        topology.stop()
    from bench.peers.launch import machine_info

    ratio = None
    if alone["ttft_p95_ms"] and beside["ttft_p95_ms"]:
        ratio = round(beside["ttft_p95_ms"] / alone["ttft_p95_ms"], 2)
    result = {
        "command": "python -m bench.batch " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "interactive_alone": alone,
        "interactive_with_batch": beside,
        "ttft_p95_ratio": ratio,
        "batch": batch,
        "machine": machine_info(load_before),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':28}{'streams':>8}{'TTFT p50 ms':>13}{'TTFT p95 ms':>13}")
    for name, row in (("interactive alone", alone), ("interactive + batch", beside)):
        print(
            f"{name:28}{row['streams']:>8}{row['ttft_p50_ms'] or '-':>13}{row['ttft_p95_ms'] or '-':>13}"
        )
    print(f"TTFT p95 with/without the batch: {ratio}")
    print(
        f"batch: {batch['completed']}/{batch['lines']} lines in {batch['seconds']} s, "
        f"{batch['output_tok_per_s']} output tok/s ({batch['status']})"
    )
    progress(f"figures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
