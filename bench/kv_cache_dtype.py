"""int8 KV cache vs the model dtype's, one process: ``python -m bench.kv_cache_dtype``.

Two engines over the same demo-model weights (dtype "auto"), one with
``kv_cache_dtype="auto"``, one with ``"int8"``, each given the same
``--kv-mb`` (their block counts are printed: int8 holds ~1.9x the tokens).

1. Greedy agreement: ``--prompts`` real chat messages (bench/data), greedy,
   ``--max-tokens`` each, through both engines; prints the share of
   requests whose output is identical, and the mean share of each output
   the int8 engine reproduces before its first different token.
2. Decode speed at long context: ``--batch`` sequences of random tokens,
   contexts uniform in ``--min-len``..``--max-len``, prefilled, then
   ``--steps`` pure decode steps of the whole batch, the two engines' steps
   interleaved (a busy machine slows both alike). Prints ms per step and
   output tok/s of each, and their ratio. ``--prompts 0`` skips part 1. Speculation off: every step is
   one token per sequence.

Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from bench.workloads import chat_messages
from gpuworkers.engine import EngineConfig, LLMEngine, SamplingParams
from gpuworkers.engine.convert_gguf import ensure_demo_model
from tokenization.tokenizer import apply_chat_template


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-mb", type=int, default=2048)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--min-len", type=int, default=1024)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    options = dict(
        kv_cache_bytes=args.kv_mb << 20,
        max_num_seqs=max(args.batch, args.prompts),
        max_num_batched_tokens=2048,
        speculative_method=None,
    )
    default = LLMEngine.from_pretrained(ensure_demo_model(), **options)
    engines = {"auto": default, "int8": with_int8_cache(default, options)}
    for name, engine in engines.items():
        cfg = engine.config
        print(
            f"{name}: {cfg.cache_dtype} KV, {cfg.num_kv_blocks} blocks of {cfg.block_size}"
            f" in {args.kv_mb} MiB ({cfg.num_kv_blocks * cfg.block_size} tokens)"
        )
    print(f"model dtype {default.config.dtype}, {args.threads} threads")

    if args.prompts:
        print_agreement(engines, args)
    print_decode_speed(engines, args)


def print_agreement(engines: dict[str, LLMEngine], args) -> None:
    tokenizer = engines["auto"].tokenizer
    messages = chat_messages()[: args.prompts]
    prompts = [apply_chat_template(tokenizer, [{"role": "user", "content": m}]) for m in messages]
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    outputs = {name: generate(engine, prompts, greedy) for name, engine in engines.items()}
    same = sum(a == b for a, b in zip(outputs["auto"], outputs["int8"], strict=True))
    shares = [prefix_share(b, a) for a, b in zip(outputs["auto"], outputs["int8"], strict=True)]
    print(
        f"greedy agreement, {len(prompts)} chat prompts x {args.max_tokens} tokens:"
        f" {same}/{len(prompts)} identical, mean share before the first difference"
        f" {sum(shares) / len(shares):.2f}"
    )


def print_decode_speed(engines: dict[str, LLMEngine], args) -> None:
    rng = random.Random(0)
    lens = [rng.randint(args.min_len, args.max_len) for _ in range(args.batch)]
    batch = [[rng.randrange(100, 49000) for _ in range(n)] for n in lens]
    # Long enough that no sequence finishes during the others' prefill (it
    # decodes meanwhile) or the timed steps: each of those steps decodes the
    # whole batch. The pools hold it all (reserve admission counts it).
    long_run = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    for name, engine in engines.items():
        started = time.perf_counter()
        for i, ids in enumerate(batch):
            engine.add_request(f"{name}-{i}", ids, long_run)
        while engine.stats()["waiting"] or any(s.is_prefilling for s in engine.scheduler.running):
            engine.step()
        print(f"{name}: prefilled {sum(lens)} tokens in {time.perf_counter() - started:.1f} s")
    times = {name: [] for name in engines}
    for _ in range(args.steps):
        for name, engine in engines.items():
            started = time.perf_counter()
            engine.step()
            times[name].append(time.perf_counter() - started)
    print(
        f"decode, {args.batch} sequences, contexts {args.min_len}..{args.max_len}"
        f" (mean {sum(lens) / len(lens):.0f}), {args.steps} steps each, interleaved:"
    )
    for name, spent in times.items():
        per_step = sum(spent) / len(spent)
        print(
            f"  {name}: {per_step * 1000:.1f} ms per step (best {min(spent) * 1000:.1f}),"
            f" {args.batch / per_step:.0f} output tok/s"
        )
    ratio = sum(times["auto"]) / sum(times["int8"])
    print(f"  int8 KV: {ratio:.2f}x the decode tok/s of {engines['auto'].config.dtype} KV")
    for name, engine in engines.items():
        running = [s for s in engine.scheduler.running if not s.is_prefilling]
        print(f"  {name}: {len(running)} sequences decoding after the timed steps")
        for i in range(len(batch)):
            engine.abort(f"{name}-{i}")
        engine.step()


def with_int8_cache(engine: LLMEngine, options: dict) -> LLMEngine:
    """An engine over ``engine``'s weights with an int8 pool of the same bytes."""
    config = EngineConfig(
        model_dir=engine.config.model_dir,
        model_id=engine.config.model_id,
        dtype=engine.config.dtype,
        max_model_len=engine.config.max_model_len,
        kv_cache_dtype="int8",
        **options,
    )
    per_token = engine.model_cfg.kv_bytes_per_token(config.dtype, config.kv_cache_dtype)
    config.num_kv_blocks = config.kv_blocks_for(per_token, config.kv_cache_bytes)
    config.num_host_blocks = config.kv_blocks_for(per_token, config.swap_space_bytes)
    return LLMEngine(config, engine.runner.model, engine.model_cfg, engine.tokenizer)


def generate(engine: LLMEngine, prompts: list[list[int]], params) -> list[list[int]]:
    outputs = [[] for _ in prompts]
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[int(out.request_id)].extend(out.choices[0].token_ids)
    return outputs


def prefix_share(candidate: list[int], reference: list[int]) -> float:
    same = 0
    for a, b in zip(candidate, reference, strict=False):
        if a != b:
            break
        same += 1
    return same / max(len(reference), 1)


if __name__ == "__main__":
    main()
