"""Streaming load while processes die: every stream ends once, usage is exact.

    python -m bench.chaos [--requests 200] [--concurrency 16] [--max-tokens 16]
                          [--faults kill_web,kill_worker,restart_redis,restart_postgres]

Starts its own topology on loopback: a private PostgreSQL (initdb in a temp
dir, run as the ``postgres`` user), a private redis-server (AOF, fsync on
every write, so a restart keeps the streams as a production Redis would),
two gpuworkers of the demo model (one torch thread, small KV) and two Daphne
web processes, each settling the usage stream in a thread of its own
(``USAGE_SETTLER_IN_PROCESS``; the Celery beat task runs the same service).
The client spreads ``--requests`` streaming chat completions over both web
processes, ``--concurrency`` at a time; a request refused before its stream
started (connection refused, 503) is retried on the other web process, as
a load balancer would. Meanwhile, as the completed count passes a share of
the requests: SIGKILL one web process, SIGKILL one worker (neither is
restarted: the survivors serve the rest), SIGKILL + restart Redis, fast
shutdown + restart PostgreSQL.

Invariants (exit 1 if any fails): every accepted stream (HTTP 200) ended
exactly once as its client saw it: completed (a finish_reason, one
``[DONE]``), an explicit error frame then ``[DONE]``, or, only for streams
on the SIGKILLed web process, a dropped connection; none hung (a read
timeout counts as a violation). One usage record per accepted response (0
missing, 0 duplicated) once the settlers caught up, and for completed ones
completion_tokens == the tokens the client counted. Afterwards no KV block
held on a surviving worker and no concurrency slot held in Redis.

The topology and the faults are in ``bench/chaos_topology.py``. Figures
to ``--out`` (bench/results/chaos.json); recovery after a fault is the time
from the fault to the end of the first request started after it that
completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.chaos_topology import ROOT, Fault, Topology, inject
from bench.load import Client, run_client
from bench.load_topology import MODEL

# Shares of the requests completed at which each fault fires, in order.
FAULTS = [
    (0.15, "kill_web"),
    (0.30, "kill_worker"),
    (0.45, "restart_redis"),
    (0.60, "restart_postgres"),
]


def progress(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--stream-timeout", type=float, default=180.0, help="per read, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos.json")
    parser.add_argument(
        "--faults",
        default=",".join(name for _, name in FAULTS),
        help="comma-separated subset of the faults, in their order"
        " (e.g. kill_worker alone: a quick death-detection figure)",
    )
    args = parser.parse_args(argv)
    names = {name for _, name in FAULTS}
    args.faults = [f for f in args.faults.split(",") if f]
    unknown = set(args.faults) - names
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; choose from {sorted(names)}")
    return args


# -- the clients ---------------------------------------------------------------


@dataclass(slots=True)
class Request:
    index: int
    web: int | None = None  # the web process whose stream was accepted
    attempts: int = 0
    refusals: list[str] | None = None
    client: Client | None = None

    @property
    def accepted(self) -> bool:
        return self.client is not None and self.client.status == 200

    def outcome(self, killed_web: int | None) -> str:
        c = self.client
        if c is None or c.status != 200:
            return "refused"
        if c.failure and ("Timeout" in c.failure or c.failure == "deadline"):
            return "hung"
        if c.errors == 1 and c.finishes == 0 and c.dones == 1 and c.after_done == 0:
            return f"error:{c.failure}"
        if c.one_terminal and c.errors == 0:
            return "completed"
        if c.dones == 0 and c.finishes + c.errors <= 1 and self.web == killed_web and c.failure:
            return "connection_lost"
        return "violation"


async def run_request(
    http: httpx.AsyncClient, topology: Topology, key: str, r: Request, args, dead: set[int]
) -> None:
    r.refusals = []
    for attempt in range(8):
        r.attempts += 1
        web = (r.index + attempt) % 2
        if web in dead:
            web = 1 - web
        c = Client(r.index)
        await run_client(http, f"{topology.base_urls[web]}/chat/completions", key, c, args)
        if c.status == 200:
            r.web, r.client = web, c
            return
        r.refusals.append(c.failure or f"HTTP {c.status}")
        if c.status is None and "ConnectError" in (c.failure or ""):
            dead.add(web)
        r.client = c
        await asyncio.sleep(0.5 * (attempt + 1))


async def run_all(topology: Topology, key: str, args) -> tuple[list[Request], list[Fault]]:
    requests = [Request(i) for i in range(args.requests)]
    faults: list[Fault] = []
    dead: set[int] = set()
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=0)
    timeout = httpx.Timeout(60, read=args.stream_timeout)

    async def one(r: Request) -> None:
        async with gate:
            await run_request(http, topology, key, r, args, dead)

    def done_count() -> int:
        return sum(r.client is not None and r.client.ended is not None for r in requests)

    async def chaos() -> None:
        for share, name in FAULTS:
            if name not in args.faults:
                continue
            while done_count() < share * args.requests:
                await asyncio.sleep(0.2)
            at = time.monotonic()
            progress(f"fault {name} after {done_count()} requests")
            fault = Fault(name, at, "")
            faults.append(fault)
            fault.detail = await asyncio.to_thread(inject, topology, name)
            fault.took_s = round(time.monotonic() - at, 2)

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        chaos_task = asyncio.create_task(chaos())
        await asyncio.gather(*(one(r) for r in requests))
        # Every threshold is below 1: a fault still under way finishes.
        await chaos_task
    for fault in faults:
        ends = [
            r.client.ended - fault.at
            for r in requests
            if r.client is not None
            and r.client.started > fault.at
            and r.outcome(None) == "completed"
        ]
        fault.recovered_s = round(min(ends), 2) if ends else None
        if fault.name == "kill_worker":
            # Streams that had tokens from the killed worker: a queued one
            # waits RECLAIM_GRACE_SECONDS for a peer instead.
            fault.detected_s = sorted(
                round(r.client.ended - fault.at, 2)
                for r in requests
                if r.client is not None
                and r.client.failure == "worker_lost"
                and r.client.tokens > 0
                and r.client.ended is not None
            )
    return requests, faults


# The web's death detection: a killed worker's started streams end within
# this (LIVENESS_TTL + a relay poll + the second look).
DETECTION_GOAL_S = 2.0


# -- checks afterwards ---------------------------------------------------------


def usage_rows(database_url: str, ids: list[str]) -> dict[str, list[tuple[str, int]]]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT response_id, status, completion_tokens FROM billing_usagerecord"
            " WHERE response_id = ANY(%s)",
            (ids,),
        ).fetchall()
    out: dict[str, list[tuple[str, int]]] = {}
    for rid, status, tokens in rows:
        out.setdefault(rid, []).append((status, tokens))
    return out


def wait_for_usage(topology: Topology, ids: list[str], timeout: float) -> tuple[dict, float]:
    """Until every response has a record (the settlers caught up) or ``timeout``."""
    started = time.monotonic()
    while True:
        try:
            rows = usage_rows(topology.database_url, ids)
        except Exception:
            rows = {}
        if len(rows) >= len(ids) or time.monotonic() - started > timeout:
            return rows, time.monotonic() - started
        time.sleep(2)


def leftovers(topology: Topology) -> dict:
    import redis

    client = redis.Redis(port=topology.redis_port)
    now_s, now_us = client.time()
    now_ms = now_s * 1000 + now_us // 1000
    inflight = {
        k.decode(): client.zcount(k, f"({now_ms}", "+inf")
        for k in client.scan_iter(match="*:inflight")
    }
    workers = {
        w: {"kv_blocks_used": info.get("kv_blocks_used"), "running": info.get("running")}
        for w in topology.worker_ids
        if w not in topology.killed and (info := topology.worker_info(w))
    }
    return {"slots_held": inflight, "workers": workers}


def settled(left: dict) -> bool:
    return not any(left["slots_held"].values()) and all(
        (w["kv_blocks_used"] or 0) == 0 and (w["running"] or 0) == 0
        for w in left["workers"].values()
    )


def summarize(requests: list[Request], faults: list[Fault], usage: dict, left: dict) -> dict:
    killed_web = 1
    outcomes = Counter(r.outcome(killed_web) for r in requests)
    accepted = [r for r in requests if r.accepted]
    ids = [r.client.response_id for r in accepted if r.client.response_id]
    missing = [rid for rid in ids if rid not in usage]
    duplicated = [rid for rid, rows in usage.items() if len(rows) > 1]
    mismatched = [
        {
            "response_id": r.client.response_id,
            "streamed": r.client.tokens,
            "recorded": usage.get(r.client.response_id),
        }
        for r in accepted
        if r.outcome(killed_web) == "completed"
        and usage.get(r.client.response_id) != [("completed", r.client.tokens)]
    ]
    refusals = Counter(reason.split(":")[0][:60] for r in requests for reason in (r.refusals or []))
    detected = [d for f in faults for d in (f.detected_s or [])]
    detection = {
        "streams": len(detected),
        "max": max(detected) if detected else None,
        "goal_max": DETECTION_GOAL_S,
        "met": bool(detected) and max(detected) < DETECTION_GOAL_S,
    }
    no_id = [r.index for r in accepted if not r.client.response_id]
    violations = {
        "hung": outcomes.get("hung", 0),
        "violation": outcomes.get("violation", 0),
        "refused_after_retries": outcomes.get("refused", 0),
        "accepted_without_response_id": len(no_id),
        "usage_missing": len(missing),
        "usage_duplicated": len(duplicated),
        "usage_mismatched": len(mismatched),
        "leftovers": 0 if settled(left) else 1,
    }
    return {
        "requests": len(requests),
        "accepted": len(accepted),
        "completed": outcomes.get("completed", 0),
        "explicit_errors": {k: v for k, v in outcomes.items() if k.startswith("error:")},
        "connection_lost_on_killed_web": outcomes.get("connection_lost", 0),
        "refused_attempts_retried": dict(refusals),
        "usage_records": len(ids) - len(missing),
        "usage_missing": missing[:20],
        "usage_duplicated": duplicated[:20],
        "usage_mismatched": mismatched[:20],
        "faults": [
            {"fault": f.name, "detail": f.detail, "took_s": f.took_s, "recovered_s": f.recovered_s}
            | ({"detected_s": f.detected_s} if f.detected_s is not None else {})
            for f in faults
        ],
        "death_detection_s": detection,
        "leftovers": left,
        "violations": violations,
        "ok": not any(violations.values()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    topology = Topology(args)
    load_before = os.getloadavg()
    try:
        progress(f"PostgreSQL, redis-server, 2 gpuworkers, 2 Daphnes (logs in {topology.logs})")
        topology.postgres_init()
        topology.postgres_start()
        topology.redis_start()
        key = topology.prepare()
        topology.start_workers_and_webs()
        for url in topology.base_urls:
            warm = httpx.post(
                f"{url}/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
                headers={"Authorization": f"Bearer {key}"},
                timeout=300,
            )
            warm.raise_for_status()
        progress(
            f"{args.requests} streams, {args.concurrency} at a time, max_tokens {args.max_tokens}"
        )
        started = time.monotonic()
        requests, faults = asyncio.run(run_all(topology, key, args))
        wall = time.monotonic() - started
        ids = [r.client.response_id for r in requests if r.accepted and r.client.response_id]
        progress("waiting for the settlers to record every response")
        usage, settle_wait = wait_for_usage(topology, ids, timeout=240)
        progress("waiting for leases and KV to be released")
        deadline = time.monotonic() + 120
        while not settled(left := leftovers(topology)) and time.monotonic() < deadline:
            time.sleep(2)
    finally:
        progress("stopping the topology")
        topology.stop()
    from bench.peers.launch import machine_info

    summary = summarize(requests, faults, usage, left)
    summary["wall_s"] = round(wall, 1)
    summary["usage_settled_after_s"] = round(settle_wait, 1)
    result = {
        "command": "python -m bench.chaos " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "machine": machine_info(load_before),
        "requests": [
            {
                "index": r.index,
                "web": r.web,
                "attempts": r.attempts,
                "outcome": r.outcome(1),
                "response_id": r.client.response_id if r.client else None,
                "tokens": r.client.tokens if r.client else 0,
                "failure": r.client.failure if r.client else None,
            }
            for r in requests
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "leftovers"}, indent=2))
    detection = summary["death_detection_s"]
    progress(
        f"death detection: worst {detection['max']} s over {detection['streams']} streams"
        f" of the killed worker (goal < {DETECTION_GOAL_S:g} s)"
    )
    progress(f"figures in {args.out}; logs in {topology.logs}")
    if not summary["ok"]:
        progress(f"INVARIANT VIOLATED: {summary['violations']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
