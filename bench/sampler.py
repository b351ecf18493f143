"""The sampler's time per step, before and after batching: ``python -m bench.sampler``.

Part 1 (always): the sampler alone on a [64, 49152] float32 logits tensor
(the demo model's vocabulary, values rounded through bfloat16 as its
lm_head produces them, so ties occur), for greedy, T=1, T=0.7 + top_p +
top_k, T=1 + top_p, and T=1 + penalties (each row with 256 prompt and 512
output tokens). "before" is the row-by-row sampler this project had until
issue 14 (copied below, unchanged but for its imports: per-row
``torch.multinomial`` with a torch.Generator each); it had no penalties.

Part 2 (``--step``): whole bfloat16 decode steps of the demo model with 64
sequences (prompts uniform in 16..``--prompt-max`` tokens), the runner's
``sample`` wrapped in a timer, once with each sampler: the sampler's share
of the step. Prints tables, writes them to ``--out``; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch

from bench.peers.launch import cpu_model
from gpuworkers.engine.runtime import tune_allocator
from gpuworkers.engine.sampling import choice_seed, sample
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling.batch import SampleInput

CASES = {
    "greedy": {"temperature": 0.0},
    "T=1": {"temperature": 1.0},
    "T=0.7 top_p=0.9 top_k=50": {"temperature": 0.7, "top_p": 0.9, "top_k": 50},
    "T=1 top_p=0.95": {"temperature": 1.0, "top_p": 0.95},
    "T=1 penalties": {
        "temperature": 1.0,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
    },
}


# The sampler before issue 14 (gpuworkers/engine/sampler.py at 38e4ad4) ----


def old_make_generator(seed: int | None, choice_index: int) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.manual_seed(random.getrandbits(63))
    else:
        generator.manual_seed((seed * 1_000_003 + choice_index) % (2**63))
    return generator


def old_sample(logits: torch.Tensor, requests) -> list[int]:
    logits = logits.float().cpu()
    results: list[int | None] = [None] * len(requests)
    greedy = [i for i, r in enumerate(requests) if r.params.greedy]
    if greedy:
        rows = [requests[i].row for i in greedy]
        if rows == list(range(logits.shape[0])):
            tokens = logits.argmax(dim=-1).tolist()
        else:
            tokens = logits.index_select(0, torch.tensor(rows)).argmax(dim=-1).tolist()
        for i, token in zip(greedy, tokens, strict=True):
            results[i] = token
    for i, request in enumerate(requests):
        if results[i] is None:
            results[i] = _old_sample_row(logits[request.row], request)
    return results  # type: ignore[return-value]


def _old_sample_row(row: torch.Tensor, request) -> int:
    params = request.params
    scores = row / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(-1)
        sorted_probs[(cumulative - sorted_probs) >= params.top_p] = 0.0
        choice = torch.multinomial(sorted_probs, 1, generator=request.generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=request.generator))


class OldRequest:
    """What the old sampler read from the batch: row, params, generator."""

    __slots__ = ("row", "params", "generator")

    def __init__(self, row, params, generator):
        self.row, self.params, self.generator = row, params, generator


# Part 1 ---------------------------------------------------------------------


def micro(rows: int, vocab: int, repeat: int) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16).float()
    lines = [
        f"sampler alone, logits [{rows}, {vocab}] float32 (bfloat16 values), "
        f"mean of {repeat} calls, {torch.get_num_threads()} threads",
        f"{'case':<28}{'before ms':>12}{'after ms':>12}{'speed-up':>10}",
    ]
    for name, settings in CASES.items():
        params = SamplingParams(**settings)
        history = [random.Random(r).choices(range(vocab), k=768) for r in range(rows)]
        inputs = [
            SampleInput(r, r, params, choice_seed(r, 0), 512, history[r], 256) for r in range(rows)
        ]
        after = _mean_ms(lambda inputs=inputs: sample(logits, inputs), repeat)
        if params.uses_penalties:
            before = None
        else:
            old = [OldRequest(r, params, old_make_generator(r, 0)) for r in range(rows)]
            before = _mean_ms(lambda old=old: old_sample(logits, old), max(1, repeat // 2))
        lines.append(_row(name, before, after))
    return lines


def _row(name: str, before: float | None, after: float) -> str:
    if before is None:
        return f"{name:<28}{'n/a':>12}{after:>12.1f}{'':>10}"
    return f"{name:<28}{before:>12.1f}{after:>12.1f}{before / after:>9.1f}x"


def _mean_ms(fn, repeat: int) -> float:
    fn()  # warm-up: allocator growth, first-call dispatch
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat * 1000


# Part 2 ---------------------------------------------------------------------


class TimedSampler:
    """Stands in for model_runner.sample and times every call."""

    def __init__(self, old: bool):
        self.old = old
        self.seconds = 0.0
        self.calls = 0
        self._generators: dict[int, torch.Generator] = {}

    def __call__(self, logits, samples):
        started = time.perf_counter()
        if self.old:
            requests = [OldRequest(s.row, s.params, self._generator(s)) for s in samples]
            results = [_Result(t) for t in old_sample(logits, requests)]
        else:
            results = sample(logits, samples)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return results

    def _generator(self, s) -> torch.Generator:
        if s.seq_id not in self._generators:
            self._generators[s.seq_id] = old_make_generator(s.params.seed, 0)
        return self._generators[s.seq_id]


class _Result:
    __slots__ = ("token_id", "logprob", "top")

    def __init__(self, token_id):
        self.token_id, self.logprob, self.top = token_id, None, None


def step_share(args) -> list[str]:
    from gpuworkers.engine import LLMEngine, model_runner
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    engine = LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype="auto",
        kv_cache_bytes=2 << 30,
        max_num_seqs=args.rows,
        max_num_batched_tokens=512,
    )
    _fill(engine, args)
    lines = [
        f"bfloat16 decode steps, {args.rows} sequences, prompts 16..{args.prompt_max} tokens, "
        f"mean of {args.steps} steps, {torch.get_num_threads()} threads, "
        f"CPU fast paths {engine.cpu_fast_paths or 'off'}",
        f"{'case':<28}{'sampler':>8}{'step ms':>10}{'sampler ms':>12}{'share':>8}",
    ]
    original = model_runner.sample
    try:
        for name in ("greedy", "T=1", "T=0.7 top_p=0.9 top_k=50"):
            for old in (True, False):
                timer = TimedSampler(old)
                model_runner.sample = timer
                step_ms, sampler_ms = _decode_steps(engine, CASES[name], timer, args.steps)
                label = "before" if old else "after"
                share = sampler_ms / step_ms
                lines.append(
                    f"{name:<28}{label:>8}{step_ms:>10.1f}{sampler_ms:>12.1f}{share:>7.0%}"
                )
                print(lines[-1], flush=True)
    finally:
        model_runner.sample = original
    return lines


def _fill(engine, args) -> None:
    """Prefill every sequence once; the cases then only change params."""
    rng = random.Random(0)
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    for i in range(args.rows):
        prompt = [rng.randrange(100, 49000) for _ in range(rng.randint(16, args.prompt_max))]
        engine.add_request(f"r{i}", prompt, params)
    while engine.stats()["waiting"] or any(s.is_prefilling for s in engine.scheduler.running):
        engine.step()


def _decode_steps(engine, settings, timer, steps: int) -> tuple[float, float]:
    params = SamplingParams(max_tokens=400, ignore_eos=True, seed=1, **settings)
    for request in engine.requests.values():
        request.params = params
    engine.step()  # warm-up
    timer.seconds = 0.0
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    elapsed = time.perf_counter() - started
    return elapsed / steps * 1000, timer.seconds / steps * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--step", action="store_true", help="also time whole decode steps")
    parser.add_argument("--prompt-max", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/sampler.txt"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tune_allocator()  # as LLMEngine.from_pretrained does on CPU
    lines = [f"$ python -m bench.sampler {' '.join(sys.argv[1:] if argv is None else argv)}"]
    lines.append(f"{platform.processor() or platform.machine()}, {cpu_model()}; {_load()} at start")
    lines += micro(args.rows, args.vocab, args.repeat)
    print("\n".join(lines), flush=True)
    if args.step:
        lines += [""] + step_share(args)
    lines.append(f"{_load()} at the end (other work on the machine inflates every figure)")
    args.out.write_text("\n".join(lines) + "\n")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
