"""Tier fairness under load: fair share against FCFS, on the real worker.

    python -m bench.fairness [--window S] [--kv-cache-mb N] [--seed N]
    python -m bench.fairness --scenario within-tier|across-tiers|service-tier

With ``--scenario``, tenants and service tiers on the real topology over
HTTP instead (bench/fairness_scenarios.py). Without it:

For each policy (fair, then fcfs) a ``manage.py gpuworker`` subprocess
serves the demo model from its own, flushed Redis database. The driver
(bench/fairness_load.py) talks to it through the bus directly, so what is
measured is the engine's scheduler, not HTTP. First a few pro requests on
the idle worker (the baseline), then a closed-loop flood of long free
requests that fills the KV pool, with a short pro request every
``--pro-interval`` seconds on top. Progress goes to stderr, the table to
stdout, every figure to bench/results/fairness.json. Nothing here asserts
on time: the figures are reported whatever they are.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from bench import fairness_scenarios
from bench.fairness_load import Driver, LoadShape
from bench.fairness_report import print_report, summarize_phase
from bench.peers.launch import ROOT, machine_info

POLICIES = ("fair", "fcfs")


def progress(message: str) -> None:
    print(f"[fairness] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    shape = LoadShape()
    parser = argparse.ArgumentParser(
        prog="python -m bench.fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9", help="flushed!")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--kv-cache-mb", type=int, default=32)
    parser.add_argument("--dtype", default="auto")
    # One thread: on a shared 2-core box a second busy process makes two
    # OpenMP threads spin against it and stalls whole steps.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--window", type=float, default=shape.window_s, help="pro trickle, s")
    parser.add_argument("--pro-interval", type=float, default=shape.pro_interval_s)
    parser.add_argument("--free-outstanding", type=int, default=shape.free_outstanding)
    parser.add_argument("--grace", type=float, default=shape.grace_s)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fairness.json")
    parser.add_argument("--scenario", choices=fairness_scenarios.SCENARIOS)
    fairness_scenarios.add_arguments(parser)
    return parser.parse_args(argv)


class Worker:
    """One gpuworker subprocess; ``stop`` always leaves nothing running."""

    def __init__(self, args: argparse.Namespace, policy: str, log_path: Path):
        self.worker_id = f"bench-fairness-{policy}-{os.getpid()}"
        self.log_path = log_path
        command = [
            sys.executable,
            str(ROOT / "manage.py"),
            "gpuworker",
            "--model",
            args.model,
            "--worker-id",
            self.worker_id,
            "--scheduling-policy",
            policy,
            "--kv-cache-mb",
            str(args.kv_cache_mb),
            "--dtype",
            args.dtype,
            "--threads",
            str(args.threads),
        ]
        env = {**os.environ, "REDIS_URL": args.redis_url, "PYTHONUNBUFFERED": "1"}
        self._log = log_path.open("w")
        # Own session: a Ctrl-C at the terminal reaches us only, and we stop it.
        self.proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_ready(self, client: redis.Redis, timeout: float = 240.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.log_tail()}")
            raw = client.hget("llm:workers", self.worker_id)
            if raw and json.loads(raw)["state"] == "ready":
                return json.loads(raw)
            time.sleep(0.5)
        raise RuntimeError(f"worker not ready after {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM drains, a second one stops at once; SIGKILL if it lingers."""
        if self.proc.poll() is None:
            for _ in range(2):
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()


async def drive(args, worker: Worker, token_ids: list[int], shape: LoadShape) -> dict:
    driver = Driver(args.redis_url, worker.worker_id, args.model, token_ids, args.seed)
    try:
        progress(f"idle baseline: {shape.idle_requests} pro requests, one at a time")
        idle = await driver.idle_baseline(shape)
        progress(f"flood of {shape.free_outstanding} free + pro every {shape.pro_interval_s}s")
        loaded, marks = await driver.loaded(shape, progress)
    finally:
        await driver.close()
    return summarize_phase(idle, loaded, marks)


def run_policy(args, policy: str, token_ids: list[int], shape: LoadShape, tmp: Path) -> dict:
    client = redis.Redis.from_url(args.redis_url, decode_responses=True)
    client.flushdb()
    worker = Worker(args, policy, tmp / f"worker-{policy}.log")
    try:
        progress(f"{policy}: starting worker {worker.worker_id}")
        started = time.monotonic()
        info = worker.wait_ready(client)
        progress(f"{policy}: ready in {time.monotonic() - started:.1f}s")
        result = asyncio.run(drive(args, worker, token_ids, shape))
        result["worker"] = {
            "kv_blocks_total": info["kv_blocks_total"],
            "block_size": info["extra"].get("block_size"),
            "max_num_seqs": info["extra"].get("max_num_seqs"),
            "scheduling_policy": info["extra"].get("scheduling_policy"),
            "tier_weights": info["extra"].get("tier_weights"),
        }
        return result
    except Exception as exc:
        progress(f"{policy}: failed: {exc!r}")
        return {"error": repr(exc), "log_tail": worker.log_tail()}
    finally:
        worker.stop()
        client.flushdb()
        client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scenario:
        return fairness_scenarios.run_scenario(args)
    from bench.flops import ModelShape
    from bench.workloads import plain_token_ids
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from tokenization.tokenizer import load_tokenizer

    # SIGTERM (and SIGINT, even when a shell started us ignoring it) unwind
    # like Ctrl-C, through every finally: each worker is stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    load_before = os.getloadavg()
    model_dir = Path(ensure_demo_model())
    tokenizer = load_tokenizer(str(model_dir))
    vocab = min(len(tokenizer), ModelShape.from_dir(model_dir).vocab)
    token_ids = plain_token_ids(tokenizer, vocab)
    shape = dataclasses.replace(
        LoadShape(),
        window_s=args.window,
        pro_interval_s=args.pro_interval,
        free_outstanding=args.free_outstanding,
        grace_s=args.grace,
    )
    policies = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
            for policy in args.policies.split(","):
                policies[policy] = run_policy(args, policy, token_ids, shape, Path(tmp))
    except KeyboardInterrupt:
        progress("interrupted: workers stopped, nothing written")
        return 130
    summary = {
        "driver": "redis bus (wire.bus.redis_bus.RedisBus), no HTTP: measures engine + scheduler",
        "model": args.model,
        "dtype": args.dtype,
        "kv_cache_mb": args.kv_cache_mb,
        "threads": args.threads,
        "seed": args.seed,
        "shape": dataclasses.asdict(shape),
    }
    summary.update(_headline(policies))
    summary.update(
        machine=machine_info(load_before),
        command=" ".join(["python", "-m", "bench.fairness", *(argv or sys.argv[1:])]),
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        wall_s=round(time.time() - started, 1),
        policies=policies,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print_report(summary)
    progress(f"wrote {args.out}")
    return 1 if any("error" in p for p in policies.values()) else 0


def _headline(policies: dict) -> dict:
    """Flat keys: <policy>_<figure>, and the two ratios the issue targets."""
    out: dict = {}
    keys = (
        "pro_ttft_p50_ms",
        "pro_ttft_p95_ms",
        "idle_pro_ttft_p50_ms",
        "idle_pro_ttft_p95_ms",
        "free_ttft_p50_ms",
        "free_ttft_p95_ms",
        "free_tok_s",
        "pro_tok_s",
        "preemptions",
        "swaps_out",
        "recomputes",
        "kv_usage_mean",
        "pro_censored",
        "free_never_started",
    )
    for policy in POLICIES:
        result = policies.get(policy) or {}
        for key in keys:
            out[f"{policy}_{key}"] = result.get(key)
    fair, fcfs = out["fair_pro_ttft_p95_ms"], out["fcfs_pro_ttft_p95_ms"]
    idle = out["fair_idle_pro_ttft_p95_ms"]
    out["ratio_pro_p95_fair_over_idle"] = round(fair / idle, 2) if fair and idle else None
    out["ratio_pro_p95_fcfs_over_fair"] = round(fcfs / fair, 2) if fair and fcfs else None
    out["targets"] = {
        "ratio_pro_p95_fair_over_idle": "<= 3",
        "ratio_pro_p95_fcfs_over_fair": ">= 5",
    }
    out["targets_met"] = {
        key: (value <= 3 if key.endswith("idle") else value >= 5)
        for key, value in (
            ("ratio_pro_p95_fair_over_idle", out["ratio_pro_p95_fair_over_idle"]),
            ("ratio_pro_p95_fcfs_over_fair", out["ratio_pro_p95_fcfs_over_fair"]),
        )
        if value is not None
    }
    return out


if __name__ == "__main__":
    sys.exit(main())
