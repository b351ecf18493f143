"""This project's engine as a peer, spawned by bench/engine.py and bench/pairs.py.

    python -m bench.peers.engine_runner --workload W --out R --model-dir M ...
        [--engine-options JSON] [--serve]

Driven through ``add_request``/``step`` by the same loop as vLLM's engine.
Besides throughput and latency it keeps, for every step that computed no
prompt tokens (a pure decode step), the step's time and model FLOPs
(bench/flops.py's formula at each sequence's context), from which
bench/engine.py derives the large-batch decode FLOP/s.
"""

from __future__ import annotations

import json
import time

from bench.flops import ModelShape
from bench.peers.common import (
    PHASES,
    Sampling,
    StepEvent,
    Track,
    median_run,
    progress,
    run_multiturn,
    run_offline,
    run_sequential,
    runner_args,
    serve,
    set_thread_env,
    warm_up,
    write_result,
)
from bench.workloads import Workload

PEER = "engine"


class EngineAdapter:
    """``StepAdapter`` over gpuworkers.engine.LLMEngine, with per-step accounting."""

    def __init__(self, engine, sampling_cls, shape: ModelShape) -> None:
        self.engine = engine
        self.sampling_cls = sampling_cls
        self.shape = shape
        self.kv_blocks_peak = 0
        # (decode batch, seconds, FLOPs) for each pure decode step.
        self.decode_steps: list[tuple[int, float, float]] = []
        self._computed_before = 0

    def add(
        self, request_id: str, prompt: list[int], max_tokens: int, salt: str, sampling: Sampling
    ) -> None:
        params = self.sampling_cls(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            ignore_eos=True,
        )
        self.engine.add_request(request_id, prompt, params, cache_salt=salt)

    def step(self) -> list[StepEvent]:
        self._computed_before = self.engine.stats()["prompt_tokens_computed"]
        return [
            StepEvent(
                request_id=out.request_id,
                token_ids=list(out.choices[0].token_ids) if out.choices else [],
                finished=out.finished,
                num_cached_tokens=out.num_cached_tokens,
            )
            for out in self.engine.step()
        ]

    def on_step(self, seconds: float, events: list[StepEvent], tracks: dict[str, Track]) -> None:
        stats = self.engine.stats()
        self.kv_blocks_peak = max(self.kv_blocks_peak, stats["kv_blocks_used"])
        if stats["prompt_tokens_computed"] != self._computed_before:
            return
        flops = 0.0
        batch = 0
        for event in events:
            if len(event.token_ids) != 1:
                continue
            track = tracks[event.request_id]
            # The k-th output token comes from the position before it, which
            # attends to prompt_len + k - 1 tokens.
            flops += self.shape.flops_per_token(track.prompt_len + len(track.token_ids) - 1)
            batch += 1
        if batch:
            self.decode_steps.append((batch, seconds, flops))


def decode_figures(steps: list[tuple[int, float, float]]) -> dict:
    """FLOP/s over the large-batch decode steps (batch >= min(32, largest seen))."""
    if not steps:
        return {"decode_steps": 0}
    threshold = min(32, max(b for b, _, _ in steps))
    large = [s for s in steps if s[0] >= threshold]
    seconds = sum(s for _, s, _ in large)
    return {
        "decode_steps": len(steps),
        "large_batch_threshold": threshold,
        "large_batch_steps": len(large),
        "large_batch_mean_size": round(sum(b for b, _, _ in large) / len(large), 1),
        "large_batch_tok_s": round(sum(b for b, _, _ in large) / seconds, 1),
        "large_batch_gflops": round(sum(f for _, _, f in large) / seconds / 1e9, 2),
        "all_decode_gflops": round(
            sum(f for _, _, f in steps) / sum(s for _, s, _ in steps) / 1e9, 2
        ),
    }


def speculation(before: dict, after: dict) -> dict:
    """Draft tokens verified and accepted between two ``engine.stats()``."""
    return {
        key: after.get(f"spec_{key}_tokens", 0) - before.get(f"spec_{key}_tokens", 0)
        for key in ("draft", "accepted")
    }


def main() -> None:
    args = runner_args(__doc__)
    set_thread_env(args.threads)
    import torch

    from gpuworkers.engine import LLMEngine, SamplingParams

    torch.set_num_threads(args.threads)
    workload = Workload.from_json(args.workload)
    options = {
        "kv_cache_bytes": int(args.kv_cache_gib * (1 << 30)),
        "enable_prefix_caching": True,
        "num_threads": args.threads,
    }
    options.update(json.loads(args.engine_options))
    progress(PEER, f"loading {args.model_dir.name} ({args.dtype}) with {options}")
    started = time.perf_counter()
    engine = LLMEngine.from_pretrained(args.model_dir, dtype=args.dtype, **options)
    load_s = time.perf_counter() - started
    progress(PEER, f"loaded in {load_s:.1f} s; warm-up")
    warmup_s = engine.warmup()
    adapter = EngineAdapter(engine, SamplingParams, ModelShape.from_dir(args.model_dir))
    # The same warm-up requests as vLLM's runner, through the same loop.
    warm_up(adapter, workload, salt="load")
    config = engine.config
    result: dict = {
        "peer": PEER,
        "torch": torch.__version__,
        "dtype": args.dtype,
        "threads": args.threads,
        "load_s": round(load_s, 2),
        "warmup_s": round(warmup_s, 2),
        "settings": {
            "enable_prefix_caching": config.enable_prefix_caching,
            "kv_cache_gib": args.kv_cache_gib,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "block_size": config.block_size,
            "admission_policy": str(config.admission_policy),
            "attention_backend": config.attention_backend,
            "speculative_method": config.speculative_method,
            "num_speculative_tokens": config.num_speculative_tokens,
        },
    }
    if args.serve:
        serve(result, lambda w, phase, salt: run_round(engine, adapter, w, phase, salt))
        return
    phases = args.phases.split(",")
    if "offline" in phases:
        runs = []
        for i in range(args.repeat):
            progress(PEER, f"offline run {i + 1}/{args.repeat}: {len(workload.offline)} requests")
            adapter.decode_steps = []
            # A fresh cache salt per run: no run reuses an earlier run's prefixes.
            before = engine.stats()
            run = run_offline(adapter, workload, salt=f"offline-r{i}", on_step=adapter.on_step)
            run["speculation"] = speculation(before, engine.stats())
            run["decode"] = decode_figures(adapter.decode_steps)
            progress(PEER, f"offline run {i + 1}: {run['tok_s']} tok/s in {run['elapsed_s']} s")
            runs.append(run)
        stats = engine.stats()
        result["offline"] = dict(median_run(runs), runs_tok_s=[r["tok_s"] for r in runs])
        result["offline"].update(
            kv_blocks_used_peak=adapter.kv_blocks_peak,
            kv_blocks_total=stats["kv_blocks_total"],
            block_size=stats.get("block_size", config.block_size),
            kv_tokens_used_peak=adapter.kv_blocks_peak * stats.get("block_size", config.block_size),
            preemptions=stats["preemptions"],
        )
    if "sequential" in phases:
        progress(PEER, f"single stream: {len(workload.offline)} requests one at a time")
        before = engine.stats()
        run = run_sequential(adapter, workload, salt="sequential")
        run["speculation"] = speculation(before, engine.stats())
        progress(PEER, f"single stream: {run['tok_s']} tok/s, ITL p50 {run['itl']['p50_ms']} ms")
        result["sequential"] = run
    if "multiturn" in phases:
        progress(PEER, f"multi-turn: {len(workload.conversations)} conversations")
        adapter.kv_blocks_peak = 0
        before = engine.stats()
        run = run_multiturn(adapter, workload, salt="multiturn", on_step=adapter.on_step)
        after = engine.stats()
        run.update(
            prompt_tokens_computed=after["prompt_tokens_computed"]
            - before["prompt_tokens_computed"],
            engine_prompt_tokens_sent=after["prompt_tokens_sent"] - before["prompt_tokens_sent"],
            prefix_cache_hit_tokens=after.get("prefix_cache_hit_tokens", 0)
            - before.get("prefix_cache_hit_tokens", 0),
            kv_blocks_used_peak=adapter.kv_blocks_peak,
            kv_blocks_total=after["kv_blocks_total"],
            block_size=after.get("block_size", config.block_size),
            kv_tokens_used_peak=adapter.kv_blocks_peak * after.get("block_size", config.block_size),
        )
        progress(
            PEER,
            f"multi-turn: {run['tok_s']} tok/s; prefill computed "
            f"{run['prompt_tokens_computed']} of {run['prompt_tokens_sent']} sent",
        )
        result["multiturn"] = run
    write_result(args.out, result)
    progress(PEER, "done")


def run_round(engine, adapter: EngineAdapter, workload: Workload, phase: str, salt: str) -> dict:
    """One timed round of ``bench.pairs`` (``--serve``): warm-up, then ``phase``."""
    warm_up(adapter, workload, salt=salt)
    adapter.decode_steps = []
    adapter.kv_blocks_peak = 0
    before = engine.stats()
    run = PHASES[phase](adapter, workload, salt=salt, on_step=adapter.on_step)
    after = engine.stats()
    run["speculation"] = speculation(before, after)
    run["decode"] = decode_figures(adapter.decode_steps)
    run.update(
        kv_blocks_used_peak=adapter.kv_blocks_peak,
        kv_blocks_total=after["kv_blocks_total"],
        preemptions=after["preemptions"] - before["preemptions"],
    )
    progress(PEER, f"{phase} {salt}: {run['tok_s']} tok/s, TPOT p50 {run['tpot']['p50_ms']} ms")
    return run


if __name__ == "__main__":
    main()
