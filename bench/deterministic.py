"""What deterministic mode costs: ``python -m bench.deterministic``.

The same seeded offline workload (random prompt ids, greedy, ``ignore_eos``)
through the engine with ``EngineConfig.deterministic`` off and on, in
bfloat16, on one shared copy of the weights; runs alternate off/on and each
figure is the median over ``--repeat`` runs, every run on a fresh engine
(no prefix-cache carry-over). Also one request decoding alone: the mode pads
every linear layer to a full tile of rows, which costs most when the batch
has one row. Prints a table; writes it, with the command and the load
average, to ``--out``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from gpuworkers.engine import LLMEngine, SamplingParams
from gpuworkers.engine.convert_gguf import ensure_demo_model
from gpuworkers.engine.models.batch_invariant import INVARIANT_ROWS

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.deterministic", description=__doc__)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-min", type=int, default=16)
    parser.add_argument("--prompt-max", type=int, default=512)
    parser.add_argument("--out-min", type=int, default=8)
    parser.add_argument("--out-max", type=int, default=64)
    parser.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / "deterministic.txt"
    )
    return parser.parse_args(argv)


def workload(args) -> list[tuple[list[int], int]]:
    rng = random.Random(args.seed)
    return [
        (
            [
                rng.randrange(100, 49000)
                for _ in range(rng.randint(args.prompt_min, args.prompt_max))
            ],
            rng.randint(args.out_min, args.out_max),
        )
        for _ in range(args.requests)
    ]


def run_offline(engine: LLMEngine, requests) -> dict:
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for _, n in requests]
    started = time.perf_counter()
    outputs = engine.generate([prompt for prompt, _ in requests], params)
    seconds = time.perf_counter() - started
    generated = sum(len(out.token_ids) for out in outputs)
    total = generated + sum(len(prompt) for prompt, _ in requests)
    return {"seconds": seconds, "tokens_per_s": total / seconds, "out_per_s": generated / seconds}


def run_single_decode(engine: LLMEngine, tokens: int = 32) -> dict:
    """Milliseconds per decode step with one sequence in the batch."""
    engine.add_request("single", list(range(100, 116)), SamplingParams(max_tokens=tokens + 1))
    engine.step()  # the prefill and the first token
    started = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return {"ms_per_step": (time.perf_counter() - started) * 1e3 / steps}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    base = LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype="auto",
        kv_cache_bytes=512 << 20,
        max_num_batched_tokens=args.budget,
        max_num_seqs=max(args.requests, 1),
    )
    model, model_cfg, tokenizer = base.runner.model, base.model_cfg, base.tokenizer

    def fresh(deterministic: bool) -> LLMEngine:
        config = dataclasses.replace(base.config, deterministic=deterministic)
        return LLMEngine(config, model, model_cfg, tokenizer)

    requests = workload(args)
    # Warm-up of both paths (kernel build, oneDNN primitive caches).
    for deterministic in (False, True):
        run_offline(fresh(deterministic), requests[:2])
    runs: dict[bool, list[dict]] = {False: [], True: []}
    singles: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(args.repeat):
        for deterministic in (False, True):
            runs[deterministic].append(run_offline(fresh(deterministic), requests))
            singles[deterministic].append(run_single_decode(fresh(deterministic)))
    median = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    off_on = [(label, runs[flag], singles[flag]) for label, flag in (("off", False), ("on", True))]
    lines = [
        "python -m bench.deterministic " + " ".join(argv if argv is not None else sys.argv[1:]),
        f"bfloat16, {args.threads} threads, {torch.__version__}, "
        f"CPU fast paths {base.runner.model.cpu_fast_paths or 'off'}, "
        f"invariant tile {INVARIANT_ROWS} rows",
        f"workload: {args.requests} requests, prompts {args.prompt_min}-{args.prompt_max}, "
        f"outputs {args.out_min}-{args.out_max} tokens, budget {args.budget}, seed {args.seed}; "
        f"median of {args.repeat} alternating runs",
        f"load average at start: {' '.join(f'{x:.2f}' for x in load_before)}; "
        f"at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        f"{'deterministic':<14}{'offline s':>10}{'tokens/s':>10}{'out tok/s':>10}"
        f"{'1-seq decode ms/step':>22}",
    ]
    for label, offline, single in off_on:
        lines.append(
            f"{label:<14}{median(offline, 'seconds'):>10.2f}{median(offline, 'tokens_per_s'):>10.1f}"
            f"{median(offline, 'out_per_s'):>10.1f}{median(single, 'ms_per_step'):>22.1f}"
        )
    ratio = median(runs[False], "seconds") / median(runs[True], "seconds")
    single_ratio = median(singles[True], "ms_per_step") / median(singles[False], "ms_per_step")
    lines += [
        "",
        f"throughput with the mode on: {ratio:.2f}x of off; "
        f"one-sequence decode step: {single_ratio:.2f}x the time",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
