"""Time one engine step at a realistic batch: ``python -m bench.decode_step``.

Fills the engine with 64 requests (prompts uniform in 16..1024 tokens, as in
bench.engine's offline workload), prefills them all, then times pure decode
steps of all 64 sequences and prints the slowest torch ops of two of them.
Compares the CPU fast paths with plain torch (--no-fast-paths); prints,
asserts nothing. The compiled kernels run outside torch's profiler: its
table shows only the torch ops left around them.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from gpuworkers.engine import LLMEngine, SamplingParams
from gpuworkers.engine.convert_gguf import ensure_demo_model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--no-fast-paths",
        action="store_true",
        help="plain torch: no CPU kernels, no packed linears (EngineConfig.cpu_fast_paths)",
    )
    parser.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "int8"], help="EngineConfig field"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_cache_bytes=2 << 30,
        max_num_seqs=args.requests,
        max_num_batched_tokens=args.budget,
        cpu_fast_paths=not args.no_fast_paths,
    )
    print(f"CPU fast paths: {engine.runner.model.cpu_fast_paths or 'off'}")
    print(f"KV cache: {engine.config.cache_dtype}, {engine.config.num_kv_blocks} blocks")
    rng = random.Random(0)
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
    lengths = [rng.randint(16, 1024) for _ in range(args.requests)]
    for i, length in enumerate(lengths):
        prompt = [rng.randrange(100, 49000) for _ in range(length)]
        engine.add_request(f"r{i}", prompt, params)
    started = time.perf_counter()
    steps = 0
    while engine.stats()["waiting"] or any(s.is_prefilling for s in engine.scheduler.running):
        engine.step()
        steps += 1
    prefill_s = time.perf_counter() - started
    print(f"prefill: {sum(lengths)} tokens in {steps} steps, {prefill_s:.2f} s")
    started = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    per_step = (time.perf_counter() - started) / args.steps
    print(f"decode step, {args.requests} sequences: {per_step * 1000:.1f} ms")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))


if __name__ == "__main__":
    main()
