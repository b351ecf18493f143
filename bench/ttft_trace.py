"""Time to first token at low load, stage by stage, through the whole topology.

    python -m bench.ttft_trace [--requests 24] [--warmup 3] [--output-len 16]
        [--database-url URL] [--out bench/results/ttft-trace.json]

The topology of ``bench.load_topology`` (redis-server, one ``gpuworker``,
Daphne, on a PostgreSQL database of the caller's) with tracing on: each
process appends its spans to a file of its own (``TRACES_FILE``), and the
control snapshot published once, as Celery beat does in production. One
client sends ``--requests`` streamed chat completions one after the other
(concurrency 1, after ``--warmup`` unrecorded ones), each a real-text user
message of bench/data/chat_prompts.jsonl as ``bench.serving`` sends them
(temperature 0.8, top_p 0.95, ``ignore_eos``), and notes the wall-clock
time of its send and of the first chunk with choices (vLLM's benchmark
client's TTFT). Each request's trace is then cut into the stages of
``bench.ttft_stages`` (they add up to the client's TTFT), and their p50,
p95 and mean go to stdout and ``--out``, with every request's row, the
command and the machine. Tracing costs a little itself (a span written
per stage); ``bench.serving`` measures TTFT without it. Nothing here
asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench import load, load_topology
from bench.peers.launch import machine_info
from bench.ttft_stages import (
    STAGES,
    IncompleteTrace,
    Span,
    by_trace,
    stages_of,
    summary,
    trace_of_response,
)
from bench.workloads import PromptPool, chat_messages

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ttft_trace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=3, help="unrecorded requests first")
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2, help="the engine's torch threads")
    parser.add_argument("--max-concurrent", type=int, default=16, help="the tier's cap")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_ttft_trace"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ttft-trace.json")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warmup < 0:
        parser.error("--requests must be positive and --warmup not negative")
    return args


def one_request(http: httpx.Client, key: str, message: str, output_len: int) -> dict:
    """One streamed chat completion: send and first-chunk wall times, its id."""
    body = {
        "model": load_topology.MODEL,
        "messages": [{"role": "user", "content": message}],
        "max_completion_tokens": output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.8,
        "top_p": 0.95,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    sent_at = time.time()
    first_at = response_id = None
    with http.stream("POST", "/chat/completions", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if first_at is None and chunk.get("choices"):
                first_at = time.time()
                response_id = chunk["id"]
    if first_at is None:
        raise RuntimeError("the stream had no chunk with choices")
    return {"response_id": response_id, "sent_at": sent_at, "first_chunk_at": first_at}


def read_spans(folder: Path) -> list[Span]:
    spans = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                spans.append(Span.from_json(json.loads(line)))
    return spans


def rows_of(requests: list[dict], folder: Path, timeout: float = 20.0) -> list[dict]:
    """Each request's stages; waits for spans still being written (the
    relay's ends after the usage is settled, behind the stream)."""
    deadline = time.monotonic() + timeout
    while True:
        traces = by_trace(read_spans(folder))
        rows, missing = [], []
        for sent in requests:
            spans = trace_of_response(traces, sent["response_id"]) or []
            try:
                stages = stages_of(
                    spans, sent_at=sent["sent_at"], first_chunk_at=sent["first_chunk_at"]
                )
            except IncompleteTrace as exc:
                missing.append(f"{sent['response_id']}: {exc}")
                continue
            ttft = round((sent["first_chunk_at"] - sent["sent_at"]) * 1000, 2)
            rows.append({"response_id": sent["response_id"], "client_ttft_ms": ttft, **stages})
        if not missing:
            return rows
        if time.monotonic() > deadline:
            raise RuntimeError("incomplete traces:\n" + "\n".join(missing[:10]))
        time.sleep(0.5)


def print_table(result: dict) -> None:
    print(f"{'stage':<18}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}")
    for key in ("client_ttft_ms", *STAGES):
        figures = result["stages_ms"][key]
        print(f"{key:<18}" + "".join(f"{figures[k]:>10}" for k in ("p50", "p95", "mean")))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("DJANGO_ENV", "local")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    load_before = os.getloadavg()
    topology = load_topology.Topology(args)
    topology.traces = Path(tempfile.mkdtemp(prefix="bench-ttft-trace-"))
    key = load_topology.prepare_database(topology)
    messages = PromptPool(chat_messages(), seed=args.seed).take(args.warmup + args.requests)
    load.progress(f"ttft-trace: starting the topology (spans in {topology.traces})")
    try:
        topology.start()
        # As in production, where beat publishes it: no catalog queries.
        load_topology.publish_snapshot(topology)
        time.sleep(3)  # the web's reader refreshes every 2 s (FLEET_SNAPSHOT_REFRESH)
        sent = []
        with httpx.Client(base_url=topology.base_url, timeout=120) as http:
            for i, message in enumerate(messages):
                done = one_request(http, key, message, args.output_len)
                if i >= args.warmup:
                    sent.append(done)
        rows = rows_of(sent, topology.traces)
    finally:
        topology.stop()
    result = {
        "command": "python -m bench.ttft_trace " + " ".join(argv or sys.argv[1:]),
        "workload": {
            "dataset": "bench/data/chat_prompts.jsonl",
            "requests": args.requests,
            "warmup": args.warmup,
            "concurrency": 1,
            "output_len": args.output_len,
            "temperature": 0.8,
            "top_p": 0.95,
            "ignore_eos": True,
            "engine_threads": args.threads,
            # The topology inherits it; PASSIVE on a crowded host (docs/benchmarks.md).
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        },
        "stages": list(STAGES),
        "stages_ms": summary(rows, ("client_ttft_ms", *STAGES)),
        "rows": rows,
        "machine": machine_info(load_before),
    }
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    load.progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
