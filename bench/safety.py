"""Inter-token latency with and without moderation of the streamed reply.

    python -m bench.safety [--streams 32] [--tokens 64] [--step-ms 20] [--rounds 10]

Starts its own topology on loopback: a private redis-server, Daphne, and a
paced synthetic worker (``bench.paced_worker``: the real Redis bus, one
token per stream every ``--step-ms``, like a GPU decode step), on a
PostgreSQL database of its own. Two tenants on a ``bench-safety`` tier
differ only in their policy: ``off`` has reply moderation off, ``on`` has
the classifier (block at 0.8) and a 50-term deny list on every reply. The
prompt stage runs for both. Each round runs ``--streams`` concurrent
streaming chat completions per tenant, one tenant after the other, the
order alternating between rounds; the gaps between consecutive content
chunks, as the client receives them, are the ITL samples.

Also measured in-process, without the network: the cost of
``ReplyScreen.feed`` per token (what the relay adds to each event).
Writes ``--out`` (bench/results/safety.json). Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx

from bench.load import percentile, progress
from bench.load_topology import ROOT, Topology

MODEL = "smollm2-135m-instruct"
DENY_TERMS = [f"forbiddenterm{i}" for i in range(45)] + [
    "project nightingale",
    "blue whale",
    "acme secret",
    "internal only",
    "do not share",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.safety", description=__doc__)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_safety")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "safety.json")
    args = parser.parse_args(argv)
    # bench.load_topology.Topology reads these for the gpuworker it does not start here.
    args.kv_cache_mb, args.threads = 64, 1
    return args


class SafetyTopology(Topology):
    """bench.load_topology's topology with the paced worker instead of a gpuworker."""

    def start(self) -> None:
        port = self.redis_url.rsplit(":", 1)[1].split("/")[0]
        redis = ["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", ""]
        self._start("redis", [*redis, "--appendonly", "no"])
        worker = [sys.executable, "-m", "bench.paced_worker", "--redis-url", self.redis_url]
        step = str(self.args.step_ms)
        self._start("worker", [*worker, "--worker-id", self.worker_id, "--step-ms", step])
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self._start("daphne", [*daphne, "config.asgi:application"])
        self._wait_ready(timeout=300)


def prepare(topology: SafetyTopology) -> dict[str, str]:
    """Create and migrate the database; the tier, the two tenants and their keys."""
    import psycopg

    url = topology.args.database_url
    name, admin_url = url.rsplit("/", 1)[1], url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    env = topology.env()
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True)
    code = "from bench.safety import create_keys; import json; print(json.dumps(create_keys()))"
    done = subprocess.run(
        [*manage, "shell", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def create_keys() -> dict[str, str]:
    """Runs inside ``manage.py shell``: one key per policy."""
    import os

    from django.forms.models import model_to_dict

    from fleet.services import served_model_register
    from safety.models import TierSafetyPolicy
    from safety.policy import DEFAULT_BOUNDS
    from safety.services import tenant_safety_policy_update
    from tenants.models import Tier
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    tier_seed_defaults()
    base = model_to_dict(Tier.objects.get(name="enterprise"), exclude=["id", "name"])
    base.update(
        display_name="Safety bench",
        rpm=100_000,
        tpm=100_000_000,
        max_concurrent_requests=1024,
        queue_sla_seconds=3600,
    )
    tier, _ = Tier.objects.update_or_create(name="bench-safety", defaults=base)
    # The enterprise tier's safety bounds: reply moderation is the tenant's choice.
    bounds = asdict(DEFAULT_BOUNDS["enterprise"])
    TierSafetyPolicy.objects.update_or_create(tier=tier, defaults=bounds)
    served_model_register(name=MODEL, context_length=8192)
    keys = {}
    for mode, output in (("off", False), ("on", True)):
        tenant = tenant_create(
            name=f"bench-safety-{mode}-{os.getpid()}-{time.time_ns()}", tier_name="bench-safety"
        )
        tenant_safety_policy_update(
            tenant=tenant,
            classifier_action="block",
            classifier_threshold=0.8,
            deny_action="block",
            deny_terms="\n".join(DENY_TERMS),
            output_moderation=output,
        )
        keys[mode] = api_key_create(tenant=tenant, name="bench")[1]
    return keys


async def one_stream(http: httpx.AsyncClient, url: str, key: str, tokens: int) -> list[float]:
    """The client-side gaps (seconds) between consecutive content chunks."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a short story about a river."}],
        "max_tokens": tokens,
        "stream": True,
    }
    arrivals, finish = [], None
    headers = {"Authorization": f"Bearer {key}"}
    async with http.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                if choice["delta"].get("content"):
                    arrivals.append(time.perf_counter())
                finish = choice.get("finish_reason") or finish
    if finish != "length":
        raise RuntimeError(f"stream ended with {finish!r}")
    return [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]


async def run_round(base_url: str, key: str, args) -> list[float]:
    limits = httpx.Limits(max_connections=args.streams * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300, connect=30)) as http:
        url = f"{base_url}/chat/completions"
        gaps = await asyncio.gather(
            *(one_stream(http, url, key, args.tokens) for _ in range(args.streams))
        )
    return [g for stream in gaps for g in stream]


def screen_cost(tokens: int, streams: int) -> dict[str, float]:
    """Microseconds of ``ReplyScreen.feed`` per token, in this process."""
    from bench.paced_worker import TOKENS
    from safety.policy import Action, Policy
    from safety.stream import ReplyScreen

    policy = Policy(
        classifier=Action.BLOCK, threshold=0.8, deny=Action.BLOCK, deny_terms=tuple(DENY_TERMS)
    )
    samples = []
    for _ in range(streams):
        screen = ReplyScreen(policy)
        for i in range(tokens):
            event = {
                "type": "delta",
                "seq": i + 2,
                "choices": [{"index": 0, "text": TOKENS[i % len(TOKENS)], "token_ids": [i]}],
            }
            start = time.perf_counter()
            result = screen.feed(event)
            samples.append((time.perf_counter() - start) * 1e6)
            assert result.cut is None
    return {
        "mean": round(statistics.fmean(samples), 1),
        "p50": round(percentile(samples, 50), 1),
        "p99": round(percentile(samples, 99), 1),
    }


def summary(gaps: list[float]) -> dict[str, float]:
    return {
        "samples": len(gaps),
        "p50_ms": round(percentile(gaps, 50) * 1000, 2),
        "p99_ms": round(percentile(gaps, 99) * 1000, 2),
        "mean_ms": round(statistics.fmean(gaps) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    topology = SafetyTopology(args)
    progress("preparing the database")
    keys = prepare(topology)
    progress("starting redis, the paced worker and daphne")
    topology.start()
    gaps: dict[str, list[float]] = {"off": [], "on": []}
    try:
        # Warm-up: the classifier loads on first use (scikit-learn, seconds).
        for mode in ("off", "on"):
            asyncio.run(
                run_round(topology.base_url, keys[mode], argparse.Namespace(streams=2, tokens=8))
            )
        for r in range(args.rounds):
            order = ("off", "on") if r % 2 == 0 else ("on", "off")
            for mode in order:
                progress(f"round {r + 1}/{args.rounds}: moderation {mode}")
                gaps[mode] += asyncio.run(run_round(topology.base_url, keys[mode], args))
    finally:
        topology.stop()
    off, on = summary(gaps["off"]), summary(gaps["on"])
    result = {
        "config": {
            "streams": args.streams,
            "tokens": args.tokens,
            "step_ms": args.step_ms,
            "rounds": args.rounds,
            "deny_terms": len(DENY_TERMS),
        },
        "itl_without_output_moderation": off,
        "itl_with_output_moderation": on,
        "overhead_pct": {
            "p50": round((on["p50_ms"] / off["p50_ms"] - 1) * 100, 2),
            "p99": round((on["p99_ms"] / off["p99_ms"] - 1) * 100, 2),
            "mean": round((on["mean_ms"] / off["mean_ms"] - 1) * 100, 2),
        },
        "screen_feed_us_per_token": screen_cost(args.tokens, args.streams),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
