"""XREAD commands the web bus issues per streamed event (a count, not a timing).

N concurrent responses stream T tokens each through the real buses: a
``RedisWorkerBus`` publishes one event of every open stream per round (as a
worker's decode step does), and N readers loop on ``RedisBus.read_events``
with ``stream_events``' poll (300 ms). Readers join one after another while
the others stream. Redis' own ``INFO commandstats`` (cmdstat_xread calls)
is read before and after, on a private redis-server started here, so no
other client is counted.

    .venv/bin/python bench/bus_xread_count.py --streams 24 --tokens 64

Runs against whatever ``wire`` is importable: compare two checkouts by
running it with each on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import threading
import time

import redis

from wire.bus.redis_bus import RedisBus, RedisWorkerBus
from wire.events import ChoiceDelta, Created, Delta, Event, EventType, Terminal

POLL_MS = 300  # inference.relay.dispatch.POLL_MS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _events(rid: str, tokens: int) -> list[Event]:
    events: list[Event] = [Created(response_id=rid, model="m", worker_id="w", prompt_tokens=1)]
    for seq in range(2, tokens + 2):
        events.append(Delta(seq, (ChoiceDelta(0, "x", (seq,)),)))
    events.append(Terminal(EventType.COMPLETED, tokens + 2))
    return events


def _stats(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("xread", "xadd")}


async def run(url: str, streams: int, tokens: int, step_ms: float, join_ms: float) -> int:
    bus, worker = RedisBus(url), RedisWorkerBus(url)
    rids = [f"bench-{i}" for i in range(streams)]
    script = {rid: _events(rid, tokens) for rid in rids}
    joined = {rid: threading.Event() for rid in rids}
    stop = threading.Event()

    def publish() -> None:
        # One event of every joined, unfinished stream per round (a decode step).
        sent = dict.fromkeys(rids, 0)
        while not stop.is_set() and any(n < len(script[r]) for r, n in sent.items()):
            batch = [
                (rid, script[rid][n])
                for rid, n in sent.items()
                if joined[rid].is_set() and n < len(script[rid])
            ]
            if batch:
                worker.publish_many(batch)
                for rid, _ in batch:
                    sent[rid] += 1
            time.sleep(step_ms / 1000)

    async def read(i: int, rid: str) -> int:
        await asyncio.sleep(i * join_ms / 1000)
        seq, got = 0, 0
        reading = asyncio.create_task(bus.read_events(rid, seq, POLL_MS))
        await asyncio.sleep(0)  # the read is under way before its first event
        joined[rid].set()
        while True:
            events = await reading
            for event in events:
                seq, got = event["seq"], got + 1
                if event["type"] == "completed":
                    return got
            reading = asyncio.create_task(bus.read_events(rid, seq, POLL_MS))

    publisher = asyncio.create_task(asyncio.to_thread(publish))
    try:
        counts = await asyncio.wait_for(
            asyncio.gather(*(read(i, rid) for i, rid in enumerate(rids))), 600
        )
    finally:
        stop.set()
        await publisher
        await bus.close()
    return sum(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0, help="time between decode steps")
    parser.add_argument("--join-ms", type=float, default=15.0, help="time between stream starts")
    args = parser.parse_args()

    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            time.sleep(0.05)
        before = _stats(client)
        events = asyncio.run(
            run(f"redis://127.0.0.1:{port}/0", args.streams, args.tokens, args.step_ms,
                args.join_ms)
        )  # fmt: skip
        after = _stats(client)
    finally:
        server.kill()
        server.wait()
    xread, xadd = after["xread"] - before["xread"], after["xadd"] - before["xadd"]
    print(
        f"streams={args.streams} tokens={args.tokens} events={events} "
        f"xread_calls={xread} xread_per_event={xread / events:.3f} "
        # Commands a script runs count too: XADDs beyond the events are wakes.
        f"wake_xadds={xadd - events}"
    )


if __name__ == "__main__":
    main()
