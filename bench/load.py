"""Many concurrent streaming clients against the real topology, on loopback.

    python -m bench.load [--clients 200] [--max-tokens 32] [--deadline 600]

Starts its own topology (``bench/load_topology.py``): a private redis-server and a Daphne + one
``gpuworker`` on free loopback ports, on a PostgreSQL database of its own
(``--database-url``, created and migrated if missing). A tenant on a
``bench-load`` tier (the enterprise tier with caps high enough to admit the
whole burst) gets one key; ``--clients`` streaming chat completions
(``logprobs`` on, so every token is one entry the client can count) are
released together through httpx. Each client records its status, TTFT and
the gaps between tokens, and checks its stream's ending: exactly one
terminal (a finish_reason or an error frame), then exactly one ``[DONE]``,
nothing after. Afterwards every response's UsageRecord is read back and
its completion_tokens compared with the tokens that client received.

Progress goes to stderr, the table to stdout, every figure to
``--out`` (bench/results/load.json). 429s count as rejected, anything else
that did not complete as failed. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.load_topology import MODEL, ROOT, Topology, prepare_database

PROMPTS = [
    "Name three colors.",
    "Write a haiku about the sea.",
    "What is 17 times 3?",
    "Give me a tip for learning Python.",
    "Describe a cat in one sentence.",
]


def progress(message: str) -> None:
    print(f"[load] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--deadline", type=float, default=600.0, help="whole burst, seconds")
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_load")
    parser.add_argument("--kv-cache-mb", type=int, default=256)
    # One thread: on a shared 2-core box a second busy process makes two
    # OpenMP threads spin against it and stalls whole steps (bench.fairness).
    parser.add_argument("--threads", type=int, default=1, help="the worker's torch threads")
    parser.add_argument("--max-concurrent", type=int, default=256, help="the tier's cap")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "load.json")
    return parser.parse_args(argv)


# -- the clients ---------------------------------------------------------------


@dataclass(slots=True)
class Client:
    index: int
    status: int | None = None
    response_id: str | None = None
    started: float = 0.0
    first_token: float | None = None
    ended: float | None = None
    tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    finishes: int = 0
    errors: int = 0
    dones: int = 0
    after_done: int = 0
    usage_tokens: int | None = None
    failure: str | None = None

    @property
    def outcome(self) -> str:
        if self.status == 429:
            return "rejected"
        if self.status == 200 and self.failure is None and self.errors == 0:
            return "completed"
        return "failed"

    @property
    def one_terminal(self) -> bool:
        """Exactly one ending (a finish_reason or an error frame), then one [DONE], then nothing."""
        return self.finishes + self.errors == 1 and self.dones == 1 and self.after_done == 0


async def run_client(http: httpx.AsyncClient, url: str, key: str, c: Client, args) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[c.index % len(PROMPTS)]}],
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
        "temperature": 0.7,
        "seed": c.index,
    }
    c.started = time.monotonic()
    try:
        async with http.stream(
            "POST", url, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            c.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                c.failure = f"HTTP {response.status_code}: {text[:200]}"
                return
            last = None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if c.dones:
                    c.after_done += 1
                    continue
                if data == "[DONE]":
                    c.dones += 1
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    c.errors += 1
                    c.failure = chunk["error"].get("code") or "error"
                    continue
                c.response_id = chunk["id"]
                if chunk.get("usage"):
                    c.usage_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    n = len((choice.get("logprobs") or {}).get("content") or [])
                    if n:
                        now = time.monotonic()
                        if c.first_token is None:
                            c.first_token = now
                        elif last is not None:
                            c.gaps.extend([(now - last) / n] * n)
                        last = now
                        c.tokens += n
                    if choice.get("finish_reason"):
                        c.finishes += 1
            if not c.dones:
                c.failure = "stream ended without [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        c.failure = f"{type(exc).__name__}: {exc}"
    finally:
        c.ended = time.monotonic()


async def burst(base_url: str, key: str, args) -> tuple[list[Client], float]:
    clients = [Client(i) for i in range(args.clients)]
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=0)
    timeout = httpx.Timeout(args.deadline, connect=30)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        url = f"{base_url}/chat/completions"
        started = time.monotonic()
        tasks = [asyncio.create_task(run_client(http, url, key, c, args)) for c in clients]
        done, pending = await asyncio.wait(tasks, timeout=args.deadline)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for c in clients:
            if c.ended is None:
                c.failure = c.failure or "deadline"
        return clients, time.monotonic() - started


def usage_by_response(database_url: str, response_ids: list[str]) -> dict[str, tuple[str, int]]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT response_id, status, completion_tokens FROM billing_usagerecord"
            " WHERE response_id = ANY(%s)",
            (response_ids,),
        ).fetchall()
    return {rid: (status, tokens) for rid, status, tokens in rows}


# -- figures -------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def summarize(clients: list[Client], wall: float, usage: dict) -> dict:
    outcomes = {
        k: sum(c.outcome == k for c in clients) for k in ("completed", "rejected", "failed")
    }
    streamed = [c for c in clients if c.status == 200]
    ttfts = [c.first_token - c.started for c in streamed if c.first_token is not None]
    gaps = [g for c in streamed for g in c.gaps]
    matched = [
        c for c in streamed if c.response_id in usage and usage[c.response_id][1] == c.tokens
    ]
    tokens = sum(c.tokens for c in streamed)
    return {
        "clients": len(clients),
        **outcomes,
        "failures": sorted({c.failure for c in clients if c.outcome == "failed" and c.failure}),
        "wall_s": round(wall, 2),
        "tokens_streamed": tokens,
        "output_tokens_per_s": round(tokens / wall, 1) if wall else None,
        "ttft_ms": {f"p{q}": ms(percentile(ttfts, q)) for q in (50, 95, 99)},
        "inter_token_ms": {f"p{q}": ms(percentile(gaps, q)) for q in (50, 99)},
        "streams_with_one_terminal": sum(c.one_terminal for c in streamed),
        "streams": len(streamed),
        "usage_records": sum(c.response_id in usage for c in streamed),
        "usage_matches_streamed_tokens": len(matched),
        "usage_mismatches": [
            {
                "response_id": c.response_id,
                "streamed": c.tokens,
                "recorded": usage.get(c.response_id),
            }
            for c in streamed
            if c not in matched
        ][:20],
        "mean_tokens_per_stream": round(statistics.mean(c.tokens for c in streamed), 1)
        if streamed
        else None,
    }


def print_table(summary: dict) -> None:
    rows = [
        ("clients", summary["clients"]),
        ("completed", summary["completed"]),
        ("rejected (429)", summary["rejected"]),
        ("failed", summary["failed"]),
        ("wall time (s)", summary["wall_s"]),
        ("output tokens/s", summary["output_tokens_per_s"]),
        ("TTFT p50 / p95 / p99 (ms)", " / ".join(str(v) for v in summary["ttft_ms"].values())),
        (
            "inter-token p50 / p99 (ms)",
            " / ".join(str(v) for v in summary["inter_token_ms"].values()),
        ),
        (
            "streams ending with exactly one terminal",
            f"{summary['streams_with_one_terminal']} / {summary['streams']}",
        ),
        (
            "usage records == streamed tokens",
            f"{summary['usage_matches_streamed_tokens']} / {summary['streams']}",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if summary["failures"]:
        print(f"failures: {', '.join(summary['failures'])}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    topology = Topology(args)
    load_before = os.getloadavg()
    try:
        progress(f"starting redis-server, gpuworker and Daphne (logs in {topology.logs})")
        key = prepare_database(topology)
        topology.start()
        progress("warming up the web process")
        warm = httpx.post(
            f"{topology.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        )
        warm.raise_for_status()
        progress(f"{args.clients} streaming clients, max_tokens {args.max_tokens}")
        clients, wall = asyncio.run(burst(topology.base_url, key, args))
        # Usage is written by the relay at each stream's end; give the last few a moment.
        ids = [c.response_id for c in clients if c.response_id]
        usage = usage_by_response(args.database_url, ids)
        for _ in range(20):
            if len(usage) >= len(ids):
                break
            time.sleep(0.5)
            usage = usage_by_response(args.database_url, ids)
    finally:
        progress("stopping the topology")
        topology.stop()
    from bench.peers.launch import machine_info

    summary = summarize(clients, wall, usage)
    result = {
        "command": "python -m bench.load " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "machine": machine_info(load_before),
        "clients": [asdict(c) | {"gaps": len(c.gaps)} for c in clients],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(summary)
    progress(f"figures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
