"""Tenant and service-tier fairness on the real topology, over HTTP.

    python -m bench.fairness --scenario within-tier|across-tiers|service-tier
        [--window S] [--flooders N] [--streams N] [--kv-cache-mb N]

A private redis-server, one ``gpuworker`` (the fair policy) and a Daphne
(bench.load_topology), on a PostgreSQL database of the caller's, with the
real tiers: every request goes through the web's auth, limits, admission
control (the per-tenant wait estimate) and the engine's fair scheduler.

- ``within-tier``: N pro tenants flood (closed loop, ``--streams`` each,
  long prompts), one light pro tenant sends a short streamed request every
  ``--light-interval`` seconds. Its idle TTFT is measured first.
- ``across-tiers``: the same pro flood; the light tenant is enterprise.
- ``service-tier``: the pro flood, and one enterprise tenant keeping
  ``--streams`` closed-loop streams per service tier (priority, default,
  flex) open: each class's TTFT and refusals.

Reported (stdout and ``bench/results/fairness-<scenario>.json``): the light
tenant's requests served and refused and its TTFT p50/p95 under the flood
against idle; each tenant's generated tokens and share, and Jain's index
over the flooding (backlogged) tenants; 429s by code. Nothing here asserts
on time: figures are what this machine measured, under whatever else ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field

from bench.load_topology import ROOT, Topology

SCENARIOS = ("within-tier", "across-tiers", "service-tier")
CLASSES = ("priority", "default", "flex")
MODEL = "smollm2-135m-instruct"
WORDS = [
    "river",
    "stone",
    "cloud",
    "apple",
    "garden",
    "window",
    "bridge",
    "silver",
    "lamp",
    "forest",
    "paper",
    "engine",
    "orange",
    "candle",
    "mountain",
    "signal",
    "pocket",
    "harbor",
    "thread",
    "ladder",
    "copper",
    "meadow",
]


def progress(message: str) -> None:
    print(f"[fairness] {message}", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_fair")
    parser.add_argument("--flooders", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4, help="per flooding tenant")
    parser.add_argument("--flood-words", type=int, default=600, help="flood prompt length")
    parser.add_argument("--flood-tokens", type=int, default=48, help="flood max_tokens")
    parser.add_argument("--light-interval", type=float, default=2.0)
    parser.add_argument("--idle-requests", type=int, default=5)
    parser.add_argument("--ramp", type=float, default=8.0, help="flood alone before measuring")


@dataclass(slots=True)
class Outcome:
    tenant: str
    service_tier: str
    started: float
    ttft_ms: float | None = None
    status: int = 0
    code: str | None = None
    completion_tokens: int = 0
    served_tier: str | None = None


@dataclass(slots=True)
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    stop: float = 0.0


def prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one(client, run: Run, key: str, tenant: str, service_tier: str, text: str, tokens: int):
    """One streamed chat completion; TTFT at the first chunk with content."""
    outcome = Outcome(tenant, service_tier, time.monotonic())
    run.outcomes.append(outcome)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "service_tier": service_tier,
    }
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with client.stream("POST", "/chat/completions", json=body, headers=headers) as r:
            outcome.status = r.status_code
            if r.status_code != 200:
                error = json.loads(await r.aread()).get("error") or {}
                outcome.code = error.get("code")
                return outcome
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                outcome.served_tier = chunk.get("service_tier", outcome.served_tier)
                if chunk.get("usage"):
                    outcome.completion_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if outcome.ttft_ms is None and any(c["delta"].get("content") for c in choices):
                    outcome.ttft_ms = (time.monotonic() - outcome.started) * 1000
    except Exception as exc:  # a dropped stream is a result, not a crash
        outcome.status, outcome.code = -1, type(exc).__name__
    return outcome


async def closed_loop(client, run, key, tenant, service_tier, rng, words, tokens):
    while time.monotonic() < run.stop:
        outcome = await one(client, run, key, tenant, service_tier, prompt(rng, words), tokens)
        if outcome.status == 429:
            # Refused by admission control or a limit: back off a little.
            await asyncio.sleep(0.5)


async def trickle(client, run, key, tenant, service_tier, interval, rng):
    tasks = []
    while time.monotonic() < run.stop:
        text = f"Name one colour. ({prompt(rng, 3)})"
        tasks.append(asyncio.create_task(one(client, run, key, tenant, service_tier, text, 8)))
        await asyncio.sleep(interval)
    await asyncio.gather(*tasks)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(round(q * (len(values) - 1))))], 1)


def jain(values: list[float]) -> float | None:
    if not values or not any(values):
        return None
    return round(sum(values) ** 2 / (len(values) * sum(v * v for v in values)), 4)


def summarize(outcomes: list[Outcome], since: float) -> dict:
    rows = [o for o in outcomes if o.started >= since]
    ttfts = [o.ttft_ms for o in rows if o.ttft_ms is not None]
    codes: dict[str, int] = {}
    for o in rows:
        if o.status != 200:
            codes[o.code or str(o.status)] = codes.get(o.code or str(o.status), 0) + 1
    return {
        "sent": len(rows),
        "served": sum(1 for o in rows if o.status == 200 and o.ttft_ms is not None),
        "refused": codes,
        "ttft_ms_p50": percentile(ttfts, 0.5),
        "ttft_ms_p95": percentile(ttfts, 0.95),
        "completion_tokens": sum(o.completion_tokens for o in rows),
        "served_tiers": sorted({o.served_tier for o in rows if o.served_tier}),
    }


async def drive(args, base_url: str, keys: dict[str, str]) -> dict:
    import httpx

    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        light = "light" if "light" in keys else None
        idle = Run(stop=float("inf"))
        if light:
            progress(f"idle baseline: {args.idle_requests} light requests, one at a time")
            for _ in range(args.idle_requests):
                await one(
                    client,
                    idle,
                    keys[light],
                    light,
                    "auto",
                    f"Name one colour. ({rng.random()})",
                    8,
                )
        run = Run()
        start = time.monotonic()
        run.stop = start + args.ramp + args.window
        flooders = sorted(k for k in keys if k.startswith("flood"))
        tasks = [
            closed_loop(client, run, keys[f], f, "auto", rng, args.flood_words, args.flood_tokens)
            for f in flooders
            for _ in range(args.streams)
        ]
        if args.scenario == "service-tier":
            tasks += [
                closed_loop(
                    client, run, keys["classes"], f"classes-{c}", c, rng, args.flood_words // 4, 16
                )
                for c in CLASSES
                for _ in range(args.streams)
            ]
        progress(
            f"flood: {len(flooders)} tenants x {args.streams} streams for {args.ramp + args.window:.0f}s"
        )

        async def light_after_ramp():
            await asyncio.sleep(args.ramp)
            await trickle(client, run, keys[light], light, "auto", args.light_interval, rng)

        if light:
            tasks.append(light_after_ramp())
        await asyncio.gather(*tasks)
        measured_from = start + args.ramp
    result: dict = {"idle": summarize(idle.outcomes, 0.0) if light else None, "tenants": {}}
    names = sorted({o.tenant for o in run.outcomes})
    for name in names:
        result["tenants"][name] = summarize(
            [o for o in run.outcomes if o.tenant == name], measured_from
        )
    total = sum(t["completion_tokens"] for t in result["tenants"].values()) or 1
    for entry in result["tenants"].values():
        entry["token_share"] = round(entry["completion_tokens"] / total, 4)
    flood_tokens = [
        result["tenants"][f]["completion_tokens"] for f in names if f.startswith("flood")
    ]
    result["jain_flooders"] = jain(flood_tokens)
    if light:
        under = result["tenants"][light]
        idle_p95 = result["idle"]["ttft_ms_p95"]
        result["light"] = {
            "served": under["served"],
            "sent": under["sent"],
            "refused": under["refused"],
            "ttft_ms_p95_flood": under["ttft_ms_p95"],
            "ttft_ms_p95_idle": idle_p95,
            "ratio_p95": round(under["ttft_ms_p95"] / idle_p95, 2)
            if under["ttft_ms_p95"] and idle_p95
            else None,
        }
    return result


def create_scenario_keys(*, scenario: str, flooders: int) -> str:
    """Runs inside ``manage.py shell``: fresh tenants and keys, as JSON."""
    from fleet.services import served_model_register
    from safety.services import tenant_safety_policy_update
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    tier_seed_defaults()
    served_model_register(name=MODEL, context_length=8192)
    tiers = {f"flood{i}": "pro" for i in range(1, flooders + 1)}
    if scenario == "within-tier":
        tiers["light"] = "pro"
    elif scenario == "across-tiers":
        tiers["light"] = "enterprise"
    else:
        tiers["classes"] = "enterprise"
    keys = {}
    stamp = f"{os.getpid()}-{time.time_ns()}"
    for name, tier in tiers.items():
        tenant = tenant_create(name=f"fair-{name}-{stamp}", tier_name=tier)
        # Random-word prompts must not be lost to the classifier (as in
        # bench.load): flagged, not refused; the checks still run.
        tenant_safety_policy_update(tenant=tenant, classifier_action="flag", deny_action="flag")
        keys[name] = api_key_create(tenant=tenant, name=name)[1]
    return json.dumps(keys)


def prepare(topology: Topology, args) -> dict[str, str]:
    import psycopg

    name = args.database_url.rsplit("/", 1)[1]
    admin_url = args.database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    env = topology.env()
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT, env=env, check=True, capture_output=True,
    )  # fmt: skip
    code = (
        "from bench.fairness_scenarios import create_scenario_keys; "
        f"print(create_scenario_keys(scenario={args.scenario!r}, flooders={args.flooders}))"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_scenario(args) -> int:
    args.max_concurrent = 0  # Topology's args; the real tiers' caps apply here
    topology = Topology(args)
    started = time.time()
    load_before = os.getloadavg()
    try:
        keys = prepare(topology, args)
        progress(f"{args.scenario}: starting redis, gpuworker, daphne")
        topology.start()
        progress(f"{args.scenario}: ready")
        result = asyncio.run(drive(args, topology.base_url, keys))
    finally:
        topology.stop()
    result = {
        "scenario": args.scenario,
        "command": "python -m bench.fairness " + " ".join(sys.argv[1:]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "shape": {
            "flooders": args.flooders,
            "streams": args.streams,
            "flood_words": args.flood_words,
            "flood_tokens": args.flood_tokens,
            "window_s": args.window,
            "ramp_s": args.ramp,
            "light_interval_s": args.light_interval,
            "kv_cache_mb": args.kv_cache_mb,
            "threads": args.threads,
        },
        **result,
    }
    out = ROOT / "bench" / "results" / f"fairness-{args.scenario}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("light", "jain_flooders") if k in result}, indent=1))
    for name, entry in result["tenants"].items():
        print(
            f"{name:18} sent {entry['sent']:4} served {entry['served']:4} "
            f"p95 {entry['ttft_ms_p95']} ms share {entry['token_share']:.3f} "
            f"refused {entry['refused']} tiers {entry['served_tiers']}"
        )
    progress(f"wrote {out.relative_to(ROOT)}")
    return 0
