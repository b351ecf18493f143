"""What n-gram speculative decoding buys: ``python -m bench.specdec``.

Paired A/B runs, speculation off then on (``EngineConfig.speculative_method``
None / "ngram"), in bfloat16 on one shared copy of the weights, each run on
a fresh engine. Workloads (greedy, ``ignore_eos``):

- ``copy``: one request repeating and editing a ~300-token passage
  (bench/workloads.py ``repetition_prompt``), prompt lookup's best case;
- ``random``: one request on random prompt ids, little to look up;
- ``batch``: ``--batch`` requests on random prompts decoding together,
  with the engine's default cost model (spec/speculator.py) and with every
  draft verified whatever its odds (``speculative_fixed_cost_rows`` huge).

The machine is shared and noisy: each figure is the median over
``--pairs`` of the ratio within a pair (on / off), runs alternating. Prints
a table; writes it, with the command and load averages, to ``--out``.
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

from bench.workloads import plain_token_ids, repetition_prompt
from gpuworkers.engine import LLMEngine, SamplingParams
from gpuworkers.engine.convert_gguf import ensure_demo_model

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.specdec", description=__doc__)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batch-tokens", type=int, default=48)
    parser.add_argument("--workloads", default="copy,random,batch")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "specdec.txt")
    return parser.parse_args(argv)


def timed(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams):
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.token_ids) for o in outputs)
    drafted = sum(o.num_draft_tokens for o in outputs)
    accepted = sum(o.num_accepted_tokens for o in outputs)
    return tokens / seconds, drafted, accepted, [o.token_ids for o in outputs]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    model_dir = ensure_demo_model()
    base = LLMEngine.from_pretrained(model_dir, kv_cache_bytes=256 << 20, speculative_method=None)
    tokenizer = base.tokenizer
    allowed = plain_token_ids(tokenizer, base.model_cfg.vocab_size)
    rng = random.Random(0)

    def engine(**options) -> LLMEngine:
        config = dataclasses.replace(base.config, **options)
        return LLMEngine(config, base.runner.model, base.model_cfg, tokenizer)

    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    batch_params = SamplingParams(max_tokens=args.batch_tokens, temperature=0.0, ignore_eos=True)
    batch_prompts = [[rng.choice(allowed) for _ in range(64)] for _ in range(args.batch)]
    cases = {
        "copy": ([repetition_prompt(tokenizer)], greedy, {}),
        "random": ([[rng.choice(allowed) for _ in range(256)]], greedy, {}),
        "batch": (batch_prompts, batch_params, {}),
        "batch-forced": (batch_prompts, batch_params, {"speculative_fixed_cost_rows": 1e9}),
    }
    wanted = args.workloads.split(",")
    if "batch" in wanted:
        wanted.append("batch-forced")
    engine(speculative_method="ngram").warmup()
    rows = []
    for name in wanted:
        prompts, params, options = cases[name]
        ratios, offs, ons, drafted, accepted = [], [], [], 0, 0
        for pair in range(args.pairs):
            off, _, _, off_tokens = timed(engine(speculative_method=None), prompts, params)
            on, drafted, accepted, on_tokens = timed(
                engine(speculative_method="ngram", **options), prompts, params
            )
            same = sum(a == b for a, b in zip(off_tokens, on_tokens, strict=True))
            print(
                f"[specdec] {name} pair {pair}: off {off:.1f} on {on:.1f} tok/s"
                f" ({accepted}/{drafted} drafts accepted; {same}/{len(prompts)} outputs equal)",
                file=sys.stderr,
                flush=True,
            )
            ratios.append(on / off)
            offs.append(off)
            ons.append(on)
        rows.append(
            (
                name,
                len(prompts),
                statistics.median(offs),
                statistics.median(ons),
                statistics.median(ratios),
                f"{accepted}/{drafted}",
            )
        )
    lines = [
        f"command: python -m bench.specdec {' '.join(argv if argv is not None else sys.argv[1:])}",
        f"threads {args.threads}, bfloat16, k={base.config.num_speculative_tokens},"
        f" prompt lookup {base.config.prompt_lookup_min}..{base.config.prompt_lookup_max},"
        f" speculative_fixed_cost_rows {base.config.speculative_fixed_cost_rows},"
        f" {args.pairs} pairs",
        f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}",
        "",
        f"{'workload':<14}{'seqs':>5}{'off tok/s':>11}{'on tok/s':>10}{'on/off':>8}  accepted/drafted",
    ]
    for name, seqs, off, on, ratio, acc in rows:
        lines.append(f"{name:<14}{seqs:>5}{off:>11.1f}{on:>10.1f}{ratio:>8.2f}  {acc}")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
