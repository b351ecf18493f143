"""Fairness inside the engine: FCFS vs tier fair share vs tenant counters.

    python -m bench.fairness_engine [--scenario within-tier|across-tiers]
        [--model tiny|demo] [--flooders 6] [--depth 16] [--steps 600] ...

In this process, no bus, no HTTP: what is measured is the engine's
scheduler over a real model's steps (``--model tiny``: a 2-layer random
Llama made on the fly with the demo model's tokenizer, so a step costs
milliseconds and the scheduler dominates; ``--model demo``: the demo
model). ``--flooders`` tenants each keep ``--depth`` long prompts in flight
(closed loop: their concurrency limit), far past the KV pool; one light
tenant sends a short request every ``--light-every`` engine steps (in
pro, or in enterprise for ``across-tiers``). The same trace runs under:

- ``fcfs``: arrival order;
- ``fair-tiers``: the fair policy without tenants (tier weights only,
  arrival order inside a tier: the engine before issue 30);
- ``fair``: the fair policy with tenants (virtual token counters).

Reported per policy: the light tenant's requests served and TTFT (in
engine steps and in ms) against the same requests on the idle engine; each
tenant's share of the generated tokens against its max-min fair share
(the light tenant's demand is what it asked for; the flooders split the
rest), with Jain's index over share / fair share. The counters equalise
weighted service (prompt + 2 x output tokens), so a light tenant whose
demand exceeds its equal share of *generated* tokens gets more of them
than that share (its prompts are short): keep its demand below it (the
default trickle is) for the index to mean what it says. Time is in engine
steps so that a loaded machine skews the ms figures only; the ms ratio
also carries the step's length under the flood (a budget's worth of
prefill) against an idle step. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.fairness_engine_report import fair_shares, jain, print_report
from bench.fairness_report import percentile
from bench.peers.launch import ROOT, machine_info

POLICIES = ("fcfs", "fair-tiers", "fair")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def progress(message: str) -> None:
    print(f"[fairness-engine] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scenario", choices=("within-tier", "across-tiers"), default="within-tier"
    )
    parser.add_argument("--model", choices=("tiny", "demo"), default="tiny")
    parser.add_argument("--flooders", type=int, default=6)
    parser.add_argument("--depth", type=int, default=16, help="each flooder's requests in flight")
    parser.add_argument("--flood-prompt", type=int, default=1300)
    parser.add_argument("--flood-output", type=int, default=64)
    parser.add_argument("--light-every", type=int, default=30, help="engine steps")
    parser.add_argument("--light-prompt", type=int, default=48)
    parser.add_argument("--light-output", type=int, default=16)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--ramp", type=int, default=100, help="steps before shares are counted")
    parser.add_argument("--idle-requests", type=int, default=10)
    parser.add_argument("--kv-blocks", type=int, default=400, help="of 16 tokens")
    parser.add_argument("--max-batched-tokens", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "fairness_engine.json"
    )
    return parser.parse_args(argv)


def tiny_model(directory: Path) -> Path:
    """A random 2-layer Llama with the demo model's tokenizer, saved once."""
    import torch
    import transformers

    from gpuworkers.engine.convert_gguf import ensure_demo_model

    demo = Path(ensure_demo_model())
    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=2,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (demo / name).exists():
            shutil.copy(demo / name, directory / name)
    return directory


def build_engine(model: Path, args, policy: str):
    from gpuworkers.engine import LLMEngine

    engine = LLMEngine.from_pretrained(
        model,
        dtype="float32" if args.model == "tiny" else "auto",
        num_kv_blocks=args.kv_blocks,
        num_host_blocks=args.kv_blocks,
        max_num_batched_tokens=args.max_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        scheduling_policy="fair" if policy.startswith("fair") else policy,
        num_threads=args.threads,
    )
    engine.warmup()
    return engine


class Trace:
    """The seeded workload, the same for every policy."""

    def __init__(self, args, vocab: int):
        self.args = args
        self.rng = random.Random(args.seed)
        self.vocab = vocab
        self.light_tier = "enterprise" if args.scenario == "across-tiers" else "pro"

    def prompt(self, length: int) -> list[int]:
        # Random ids: no prefix is shared, every prompt token is computed.
        return [self.rng.randrange(100, self.vocab) for _ in range(length)]


def run_policy(model: Path, args, policy: str) -> dict:
    """The flood and the light tenant's trickle under ``policy``."""
    from gpuworkers.engine import SamplingParams

    engine = build_engine(model, args, policy)
    trace = Trace(args, engine.model_cfg.vocab_size)
    with_tenants = policy == "fair"
    flood_params = SamplingParams(max_tokens=args.flood_output, ignore_eos=True, temperature=0.0)
    light_params = SamplingParams(max_tokens=args.light_output, ignore_eos=True, temperature=0.0)
    owner: dict[str, str] = {}
    live: Counter[str] = Counter()
    sent: dict[str, tuple[int, float]] = {}  # light request -> (step, wall) added
    first: dict[str, tuple[int, float]] = {}
    # Every tenant, so that one generating nothing still counts.
    tokens = dict.fromkeys([f"f{i}" for i in range(args.flooders)] + ["light"], 0)
    shapes = {
        "flood": ("pro", args.flood_prompt, flood_params),
        "light": (trace.light_tier, args.light_prompt, light_params),
    }

    def submit(tenant: str, kind: str) -> str:
        tier, length, params = shapes[kind]
        request_id = f"{tenant}-{len(owner)}"
        tenant_id = tenant if with_tenants else None
        engine.add_request(request_id, trace.prompt(length), params, tier=tier, tenant=tenant_id)
        owner[request_id] = tenant
        return request_id

    started = time.perf_counter()
    for now in range(args.steps):
        for i in range(args.flooders):
            tenant = f"f{i}"
            while live[tenant] < args.depth:
                submit(tenant, "flood")
                live[tenant] += 1
        if now % args.light_every == args.light_every // 2:
            sent[submit("light", "light")] = (now, time.perf_counter())
        for out in engine.step():
            tenant = owner[out.request_id]
            generated = sum(len(c.token_ids) for c in out.choices)
            if now >= args.ramp:
                tokens[tenant] += generated
            if generated and out.request_id in sent and out.request_id not in first:
                first[out.request_id] = (now, time.perf_counter())
            if out.finished and tenant != "light":
                live[tenant] -= 1
    wall = time.perf_counter() - started
    stats = engine.stats()
    return summarize(args, sent, first, tokens, stats, wall)


def idle_baseline(model: Path, args) -> dict:
    """The light tenant's requests alone, one at a time, on an idle engine."""
    from gpuworkers.engine import SamplingParams

    engine = build_engine(model, args, "fair")
    trace = Trace(args, engine.model_cfg.vocab_size)
    params = SamplingParams(max_tokens=args.light_output, ignore_eos=True, temperature=0.0)
    steps, ms = [], []
    for i in range(args.idle_requests):
        engine.add_request(f"idle-{i}", trace.prompt(args.light_prompt), params, tenant="light")
        added, now = time.perf_counter(), 0
        got = False
        while engine.has_unfinished_requests():
            for out in engine.step():
                if not got and any(c.token_ids for c in out.choices):
                    steps.append(now + 1)
                    ms.append((time.perf_counter() - added) * 1e3)
                    got = True
            now += 1
    return {"ttft_p50_steps": percentile(steps, 0.5), "ttft_p95_steps": percentile(steps, 0.95),
            "ttft_p50_ms": percentile(ms, 0.5), "ttft_p95_ms": percentile(ms, 0.95)}  # fmt: skip


def summarize(args, sent, first, tokens, stats, wall) -> dict:
    end = args.steps
    # Steps to the first token, the step that produced it included (1 on an
    # idle engine); one with no token by the end counts as waiting until then.
    steps = [(first[r][0] if r in first else end) - sent[r][0] + 1 for r in sent]
    ms = [first[r][1] - sent[r][1] for r in sent if r in first]
    window = [r for r in sent if sent[r][0] >= args.ramp]
    demand = len(window) * args.light_output
    shares = fair_shares(tokens, {"light": demand})
    total = sum(tokens.values()) or 1
    return {
        "light_sent": len(sent),
        "light_served": len(first),
        "light_ttft_p50_steps": percentile(steps, 0.5),
        "light_ttft_p95_steps": percentile(steps, 0.95),
        "light_ttft_max_steps": percentile(steps, 1.0),
        "light_ttft_p50_ms": percentile([x * 1e3 for x in ms], 0.5),
        "light_ttft_p95_ms": percentile([x * 1e3 for x in ms], 0.95),
        "tokens": dict(sorted(tokens.items())),
        "share": {t: round(n / total, 4) for t, n in sorted(tokens.items())},
        "fair_share": {t: round(s, 4) for t, s in sorted(shares.items())},
        "jain": jain({t: tokens[t] / total / shares[t] for t in shares if shares[t] > 0}),
        "preemptions": stats["preemptions"],
        "swaps_out": stats["swaps_out"],
        "recomputes": stats["recomputes"],
        "steps": args.steps,
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from bench.serving import model_dir

    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-fairness-engine-") as tmp:
        model = tiny_model(Path(tmp)) if args.model == "tiny" else Path(model_dir())
        progress(f"idle baseline: {args.idle_requests} light requests on an idle engine")
        idle = idle_baseline(model, args)
        policies = {}
        for policy in args.policies.split(","):
            progress(f"{policy}: {args.steps} steps")
            policies[policy] = run_policy(model, args, policy)
    summary = {
        "scenario": args.scenario,
        "model": args.model,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "idle": idle,
        "policies": policies,
        "machine": machine_info(load_before),
        "command": " ".join(["python", "-m", "bench.fairness_engine", *(argv or sys.argv[1:])]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print_report(summary)
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
