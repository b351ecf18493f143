"""Cache-aware routing against round robin, on three real gpuworkers.

    python -m bench.routing [--conversations N] [--turns N] [--hot-requests N]

Three ``manage.py gpuworker`` subprocesses serve the demo model from Redis.
The driver dispatches through ``inference.relay.dispatch.dispatch_request`` (the
web tier's own routing code, no HTTP) with ``FLEET_ROUTING_POLICY`` set per
phase, and reads each response's terminal event:

1. Multi-turn: conversations under a few short system prompts with long
   user turns, each turn sending the whole history (which soon dominates
   the prompt, as in a real chat). ``cache_aware`` (ring + load fallback) and
   ``round_robin`` run the same shape with fresh text each, so no phase
   reuses another's cache. Figures: prefix-cache hit rate (cached prompt
   tokens / prompt tokens) and TTFT p50/p95.
2. Hot prefix: one system prompt and one routing key for all traffic (a
   stateless app keyed by its system prompt), closed loop. ``affinity_only``
   against ``cache_aware``: the busiest worker's mean queue (running +
   waiting, sampled from heartbeats) against the fleet mean.

Figures to bench/results/routing.json; nothing asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "river",
    "mountain",
    "quantum",
    "ledger",
    "harvest",
    "signal",
    "copper",
    "lantern",
    "orbit",
    "meadow",
    "archive",
    "falcon",
    "granite",
    "harbor",
    "pixel",
    "thunder",
    "velvet",
    "canyon",
    "ember",
    "glacier",
    "compass",
    "mosaic",
    "nectar",
    "prism",
    "saddle",
    "timber",
    "violet",
    "walnut",
    "zephyr",
    "beacon",
]


def progress(message: str) -> None:
    print(f"[routing] {message}", file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--system-prompts", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--hot-requests", type=int, default=18)
    parser.add_argument("--hot-clients", type=int, default=6)
    parser.add_argument("--max-queue", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "routing.json")
    return parser.parse_args(argv)


def setup_django(args) -> None:
    os.environ.update(
        REDIS_URL=args.redis_url,
        EMBEDDED_ENGINE="0",
        DJANGO_SETTINGS_MODULE="config.settings",
        FLEET_SNAPSHOT_KEY=f"bench-routing-{os.getpid()}:snapshot",
        FLEET_SNAPSHOT_REFRESH="1",
    )
    import django

    django.setup()


def publish_thresholds(args) -> None:
    """A snapshot with the routing thresholds and a pro tier that never refuses."""
    from fleet.snapshot import snapshot_store

    tier = dict(
        name="pro", display_name="Pro", rpm=10**6, tpm=10**9, monthly_token_quota=10**12,
        max_context_tokens=8192, max_output_tokens=4096, max_concurrent_requests=10**4,
        scheduling_weight=0.35, priority=1, queue_sla_seconds=3600, api_access=True,
    )  # fmt: skip
    routing = dict(
        max_kv_usage=0.85, max_queue=args.max_queue, successors=2, virtual_nodes=64,
        target_tokens_per_replica=8192, max_queue_age_seconds=2.0, warm_reserve=0,
    )  # fmt: skip
    snapshot_store(
        {"version": 1, "published_at": time.time(), "routing": routing, "tiers": {"pro": tier},
         "models": {}, "deployments": [], "rollouts": []}
    )  # fmt: skip


class Workers:
    """The gpuworker subprocesses; ``stop`` always leaves nothing running."""

    def __init__(self, args, logs: Path):
        self.ids = [f"bench-routing-{os.getpid()}-{i}" for i in range(args.workers)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING"}
        self.procs = []
        for worker_id in self.ids:
            command = [
                sys.executable, str(ROOT / "manage.py"), "gpuworker", "--model", args.model,
                "--worker-id", worker_id, "--kv-cache-mb", str(args.kv_cache_mb),
                "--threads", str(args.threads),
            ]  # fmt: skip
            log = (logs / f"{worker_id}.log").open("w")
            self.procs.append(
                subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log,
                                 start_new_session=True)
            )  # fmt: skip

    async def wait_ready(self, bus, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a gpuworker exited during start-up")
            ready = {w.worker_id for w in await bus.list_workers() if w.state == "ready"}
            if ready >= set(self.ids):
                return
            await asyncio.sleep(0.5)
        raise RuntimeError("gpuworkers not ready in time")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@dataclasses.dataclass
class Result:
    worker_id: str
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float | None
    text: str


class Driver:
    def __init__(self, args, tokenizer, bus):
        self.args = args
        self.tokenizer = tokenizer
        self.bus = bus

    async def ask(self, messages: list[dict], routing_key: str) -> Result:
        from inference.relay.dispatch import dispatch_request, stream_events
        from tokenization import apply_chat_template
        from wire.events import Delta, Terminal
        from wire.requests import GenerationRequest
        from wire.sampling import Sampling

        sampling = Sampling(max_tokens=self.args.max_tokens, temperature=0.0)
        request = GenerationRequest(
            response_id=f"bench-{uuid.uuid4().hex}",
            model=self.args.model,
            prompt_token_ids=apply_chat_template(self.tokenizer, messages),
            sampling=sampling,
            tier="pro",
            tenant_id=1,
            cache_salt="bench",
        )
        worker = await dispatch_request(request, bus=self.bus, routing_key=routing_key)
        text = []
        async for event in stream_events(
            request.response_id, worker_id=worker.worker_id, bus=self.bus
        ):
            if isinstance(event, Delta):
                text.extend(c.text for c in event.choices)
            elif isinstance(event, Terminal):
                return Result(
                    worker.worker_id,
                    event.usage.prompt_tokens,
                    event.usage.cached_tokens,
                    event.metrics.ttft_ms,
                    "".join(text),
                )
        raise RuntimeError("stream ended without a terminal event")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def multi_turn(driver: Driver, label: str) -> dict:
    """Conversations under a few system prompts; every turn resends the history."""
    args = driver.args
    rng = random.Random(f"{args.seed}-{label}")
    systems = [
        f"You are assistant {label}-{i}. House rules: {words(rng, 40)}"
        for i in range(args.system_prompts)
    ]
    results: list[Result] = []

    async def conversation(index: int) -> None:
        messages = [{"role": "system", "content": systems[index % len(systems)]}]
        for turn in range(args.turns):
            messages.append({"role": "user", "content": f"Turn {turn}: {words(rng, 80)}"})
            key = f"{index % len(systems)}:{label}-conversation-{index}"
            result = await driver.ask(messages, key)
            results.append(result)
            messages.append({"role": "assistant", "content": result.text})

    started = time.monotonic()
    await asyncio.gather(*(conversation(i) for i in range(args.conversations)))
    return summarize(results, time.monotonic() - started)


async def hot_prefix(driver: Driver, label: str) -> dict:
    """One system prompt and one routing key for every request, closed loop."""
    from fleet.snapshot import snapshot_current

    args = driver.args
    rng = random.Random(f"{args.seed}-hot-{label}")
    system = f"You are the {label} summariser. Style guide: {words(rng, 150)}"
    remaining = list(range(args.hot_requests))
    results: list[Result] = []
    samples: dict[str, list[int]] = {}
    done = asyncio.Event()

    async def client() -> None:
        while remaining:
            remaining.pop()
            question = f"Summarise: {words(rng, 30)}"
            messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ]
            results.append(await driver.ask(messages, f"hot:{label}"))

    async def sample() -> None:
        while not done.is_set():
            for w in await driver.bus.list_workers():
                samples.setdefault(w.worker_id, []).append(w.running + w.waiting)
            await asyncio.sleep(0.25)

    snapshot_current()
    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(args.hot_clients)))
    done.set()
    await sampler
    summary = summarize(results, time.monotonic() - started)
    means = {w: sum(q) / len(q) for w, q in samples.items() if q}
    fleet_mean = sum(means.values()) / len(means) if means else 0.0
    busiest = max(means.values(), default=0.0)
    summary.update(
        mean_queue_by_worker={w: round(q, 2) for w, q in sorted(means.items())},
        busiest_queue_mean=round(busiest, 2),
        fleet_queue_mean=round(fleet_mean, 2),
        busiest_over_mean=round(busiest / fleet_mean, 2) if fleet_mean else None,
        peak_queue=max((max(q) for q in samples.values() if q), default=0),
    )
    return summary


def summarize(results: list[Result], seconds: float) -> dict:
    from bench.fairness_report import percentile

    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    ttfts = [r.ttft_ms for r in results if r.ttft_ms is not None]
    per_worker: dict[str, int] = {}
    for r in results:
        per_worker[r.worker_id] = per_worker.get(r.worker_id, 0) + 1
    return {
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefix_cache_hit_rate": round(cached / prompt, 3) if prompt else 0.0,
        "ttft_p50_ms": percentile(ttfts, 0.5),
        "ttft_p95_ms": percentile(ttfts, 0.95),
        "requests_by_worker": dict(sorted(per_worker.items())),
        "wall_s": round(seconds, 1),
    }


async def run(args, tokenizer) -> dict:
    from django.conf import settings

    from wire.bus.redis_bus import RedisBus

    bus = RedisBus(args.redis_url)
    phases: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as logs:
        workers = Workers(args, Path(logs))
        try:
            progress(f"starting {args.workers} gpuworkers")
            await workers.wait_ready(bus)
            driver = Driver(args, tokenizer, bus)
            for policy in ("cache_aware", "round_robin"):
                settings.FLEET_ROUTING_POLICY = policy
                progress(f"multi-turn, {policy}")
                phases[f"multi_turn_{policy}"] = await multi_turn(driver, policy)
            for policy in ("affinity_only", "cache_aware"):
                settings.FLEET_ROUTING_POLICY = policy
                progress(f"hot prefix, {policy}")
                phases[f"hot_prefix_{policy}"] = await hot_prefix(driver, policy)
        finally:
            workers.stop()
            await bus.close()
    return phases


def print_report(phases: dict) -> None:
    from bench.report import _fmt

    a, b = phases["multi_turn_cache_aware"], phases["multi_turn_round_robin"]
    print(f"\n{'multi-turn':<28}{'cache-aware':>14}{'round robin':>14}")
    for key in ("requests", "prefix_cache_hit_rate", "ttft_p50_ms", "ttft_p95_ms", "wall_s"):
        print(f"{key:<28}{_fmt(a[key], 3):>14}{_fmt(b[key], 3):>14}")
    a, b = phases["hot_prefix_affinity_only"], phases["hot_prefix_cache_aware"]
    print(f"\n{'hot prefix (one key)':<28}{'affinity only':>14}{'+ fallback':>14}")
    for key in (
        "requests", "busiest_queue_mean", "fleet_queue_mean", "busiest_over_mean",
        "peak_queue", "prefix_cache_hit_rate", "ttft_p50_ms", "ttft_p95_ms",
    ):  # fmt: skip
        print(f"{key:<28}{_fmt(a[key], 2):>14}{_fmt(b[key], 2):>14}")
    print()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_django(args)
    from bench.peers.launch import machine_info
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from tokenization.tokenizer import load_tokenizer

    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.time()
    load_before = os.getloadavg()
    tokenizer = load_tokenizer(str(ensure_demo_model()))
    publish_thresholds(args)
    try:
        phases = asyncio.run(run(args, tokenizer))
    except KeyboardInterrupt:
        progress("interrupted: workers stopped, nothing written")
        return 130
    summary = {
        "driver": "inference.relay.dispatch over the Redis bus, no HTTP; 3 gpuworker processes",
        "model": args.model,
        "shape": {k: v for k, v in vars(args).items() if k not in ("out", "redis_url")},
        "machine": machine_info(load_before),
        "command": " ".join(["python", "-m", "bench.routing", *(argv or sys.argv[1:])]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "phases": phases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print_report(phases)
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
