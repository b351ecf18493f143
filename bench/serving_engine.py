"""``bench.serving``'s workload fed to the engine in this process: no HTTP, no bus.

    python -m bench.serving_engine [--num-prompts 64] [--max-concurrency 24]
        [--input-len 384] [--output-len 160] [--threads 2] [--no-chat-template]

The same shape as ``bench.serving``: prompts of ``--input-len`` random
token ids, decoded to text and put through the model's chat template the
way the API server does (so every prompt starts with the template's shared
system turn, which the prefix cache serves), ``ignore_eos``, temperature 1.0
(the client sends none), at most ``--max-concurrency`` requests in flight,
the next one added as one finishes. Its output tok/s next to
``bench.serving``'s says what the topology (Daphne, the bus, the database,
the client sharing the cores) costs. ``--no-chat-template`` sends the raw
random ids instead (no shared prefix). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

from bench import load
from bench.serving import add_workload_args, model_dir


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving_engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_workload_args(parser)
    # The gpuworker's step budget (settings.ENGINE_MAX_BATCHED_TOKENS).
    parser.add_argument("--max-batched-tokens", type=int, default=1024)
    # The gpuworker's policy (settings.ENGINE_SCHEDULING_POLICY).
    parser.add_argument("--policy", default="fair", help="the engine's scheduling_policy")
    parser.add_argument("--no-chat-template", action="store_true")
    return parser.parse_args(argv)


def build_prompts(tokenizer, args) -> list[list[int]]:
    """Random ids, as text, through the chat template (unless told not to)."""
    rng = random.Random(args.seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(tokenizer.vocab_size) if i not in special]
    prompts = []
    for _ in range(args.num_prompts):
        ids = [rng.choice(vocab) for _ in range(args.input_len)]
        if args.no_chat_template:
            prompts.append(ids)
            continue
        text = tokenizer.decode(ids)
        messages = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        prompts.append(tokenizer.encode(rendered, add_special_tokens=False))
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from transformers import AutoTokenizer

    from gpuworkers.engine import LLMEngine, SamplingParams

    torch.set_num_threads(args.threads)
    directory = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = build_prompts(tokenizer, args)
    engine = LLMEngine.from_pretrained(
        directory,
        dtype="auto",
        kv_cache_bytes=args.kv_cache_mb << 20,
        max_num_batched_tokens=args.max_batched_tokens,
        scheduling_policy=args.policy,
        num_threads=args.threads,
    )
    load.progress(f"engine: warm-up ({engine.warmup():.1f} s)")
    params = SamplingParams(max_tokens=args.output_len, temperature=1.0, ignore_eos=True)
    load_before = os.getloadavg()
    pending = list(enumerate(prompts))
    added: dict[str, float] = {}
    first: dict[str, float] = {}
    in_flight = outputs = 0
    started = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and in_flight < args.max_concurrency:
            index, prompt = pending.pop(0)
            engine.add_request(f"r{index}", prompt, params)
            added[f"r{index}"] = time.perf_counter()
            in_flight += 1
        for out in engine.step():
            tokens = sum(len(c.token_ids) for c in out.choices)
            outputs += tokens
            if tokens and out.request_id not in first:
                first[out.request_id] = time.perf_counter()
            in_flight -= out.finished
    duration = time.perf_counter() - started
    ttft = sorted(first[r] - added[r] for r in first)
    result = {
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "chat_template": not args.no_chat_template,
        "max_batched_tokens": args.max_batched_tokens,
        "policy": args.policy,
        "prompt_tokens": sum(len(p) for p in prompts),
        "output_tokens": outputs,
        "duration": round(duration, 2),
        "output_throughput": round(outputs / duration, 2),
        "median_ttft_ms": round(ttft[len(ttft) // 2] * 1e3, 1),
        "p99_ttft_ms": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] * 1e3, 1),
        "loadavg_start": [round(x, 2) for x in load_before],
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
