"""The GPU check: FlashInfer against the torch backend on CUDA, then timings.

    python -m bench.gpu.check --model-src .gpu-model --out $OUT/gpu-check.json

Run by bench/gpu/check.sh on a lent GPU machine (bench/gpu/prepare.sh says
how the model's config, tokenizer and the FlashInfer wheel get there). The
model is the demo model's architecture with seeded random weights: its
real weights cannot travel to that machine, and a comparison of two
attention kernels, or their speed, does not depend on what the weights say.

1. Parity, bfloat16, same prompts, same batch: the first token's top-5
   log-probabilities through each backend (the largest difference over
   the prompts), and greedy agreement over 16 tokens, once with whole
   prefills and once with 64-token chunks (chunked prefill after cached
   context is FlashInfer's paged prefill with a causal offset).
2. Speed of each backend: decode at batch 1, 8, 32 and 64 (128-token
   prompts, 128 new tokens; output tok/s over the whole batch), and
   prefill of 8 x 1024 tokens (prompt tok/s).

Prints progress; writes every figure to ``--out``. Exits 1 when the
parity figures miss their bounds (see ``PARITY_BOUNDS``). ``--plumbing``
runs the same steps on the CPU with the torch backend on both sides and
small sizes: a check of this script, not of any kernel.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

# A bfloat16 logprob of the same token through two kernels: 0.1 is the
# bound tests/gpuworkers/engine/test_flashinfer_backend.py uses on the real
# model; greedy may flip a late token on a near-tie, so agreement is
# counted over the first 8 tokens, with one prompt of eight allowed to differ.
PARITY_BOUNDS = {"max_logprob_diff": 0.1, "min_prompts_agreeing": 7}
DECODE_BATCHES = (1, 8, 32, 64)
# The backend under test and its reference; --plumbing swaps in torch/CPU.
SETUP = {"device": "cuda", "backends": ("torch", "flashinfer"), "new_tokens": 128, "kv": 4 << 30}


def progress(message: str) -> None:
    print(f"[gpu-check] {message}", file=sys.stderr, flush=True)


def build_model_dir(source: Path, target: Path, seed: int) -> Path:
    """The demo architecture with seeded random weights, saved as safetensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    config = LlamaConfig.from_pretrained(target)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(target, safe_serialization=True)
    return target


def engine(model_dir: Path, backend: str, **options):
    from gpuworkers.engine import LLMEngine

    return LLMEngine.from_pretrained(
        model_dir,
        dtype="bfloat16",
        device=SETUP["device"],
        attention_backend=backend,
        kv_cache_bytes=SETUP["kv"],
        **options,
    )


def prompts(count: int, length: int | tuple[int, int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = (
            length
            if isinstance(length, int)
            else int(torch.randint(*length, (1,), generator=generator))
        )
        out.append(torch.randint(100, 40000, (n,), generator=generator).tolist())
    return out


def parity(model_dir: Path, chunk: int | None) -> dict:
    from gpuworkers.engine import SamplingParams

    batch = prompts(8, (16, 512), seed=1)
    params = SamplingParams(
        max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=5
    )
    options = {"max_num_batched_tokens": chunk} if chunk else {}
    results = []
    for backend in SETUP["backends"]:
        built = engine(model_dir, backend, **options)
        assert built.runner.backend.name == backend, built.runner.backend.name
        results.append(built.generate(batch, params))
        del built
        release()
    worst, agreeing, agreeing_16 = 0.0, 0, 0
    for b, a in zip(*results, strict=True):
        first_a, first_b = a.choices[0].logprobs[0], b.choices[0].logprobs[0]
        top_b = {token: logprob for token, _, logprob in first_b.top}
        for token, _, logprob in first_a.top:
            if token in top_b:
                worst = max(worst, abs(logprob - top_b[token]))
        agreeing += a.choices[0].token_ids[:8] == b.choices[0].token_ids[:8]
        agreeing_16 += a.choices[0].token_ids == b.choices[0].token_ids
    return {
        "prefill_chunk": chunk,
        "max_first_token_logprob_diff": round(worst, 4),
        "prompts_agreeing_8_tokens": agreeing,
        "prompts_agreeing_16_tokens": agreeing_16,
        "prompts": len(batch),
    }


def release() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def synchronize() -> None:
    if SETUP["device"] == "cuda":
        torch.cuda.synchronize()


def timed_generate(built, batch, params) -> float:
    synchronize()
    started = time.perf_counter()
    built.generate(batch, params)
    synchronize()
    return time.perf_counter() - started


def speed(model_dir: Path, backend: str) -> dict:
    from gpuworkers.engine import SamplingParams

    built = engine(model_dir, backend, max_num_seqs=max(DECODE_BATCHES))
    built.warmup()
    new_tokens = SETUP["new_tokens"]
    decode = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    figures: dict = {"decode_tok_s": {}}
    for size in DECODE_BATCHES:
        batch = prompts(size, 128, seed=size)
        timed_generate(built, batch[:1], SamplingParams(max_tokens=4, ignore_eos=True))
        seconds = timed_generate(built, batch, decode)
        figures["decode_tok_s"][size] = round(size * new_tokens / seconds, 1)
        progress(f"{backend}: decode batch {size}: {figures['decode_tok_s'][size]} tok/s")
    prefill = prompts(8, 1024, seed=99)
    seconds = timed_generate(built, prefill, SamplingParams(max_tokens=1, ignore_eos=True))
    figures["prefill_tok_s_8x1024"] = round(8 * 1024 / seconds, 1)
    progress(f"{backend}: prefill 8 x 1024: {figures['prefill_tok_s_8x1024']} tok/s")
    del built
    release()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.check", description=__doc__)
    parser.add_argument("--model-src", type=Path, default=Path(".gpu-model"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/gpu-check-model"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/gpu-check.json"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plumbing", action="store_true", help="CPU, torch on both sides")
    args = parser.parse_args(argv)
    if args.plumbing:
        SETUP.update(device="cpu", backends=("torch", "torch"), new_tokens=8, kv=256 << 20)
    elif not torch.cuda.is_available():
        print("no CUDA device: this check runs on a GPU machine", file=sys.stderr)
        return 2
    result: dict = {
        "device": torch.cuda.get_device_name(0) if SETUP["device"] == "cuda" else "cpu",
        "torch": torch.__version__,
        "weights": f"random, seed {args.seed} (the demo architecture)",
    }
    try:
        import flashinfer

        result["flashinfer"] = flashinfer.__version__
    except ImportError as error:
        result["flashinfer"] = f"not importable: {error}"
    progress("building the model directory")
    model_dir = build_model_dir(args.model_src, args.model_dir, args.seed)
    failed = []
    result["parity"] = []
    for chunk in (None, 64):
        progress(f"parity, prefill chunk {chunk or 'whole'}")
        figures = parity(model_dir, chunk)
        result["parity"].append(figures)
        progress(json.dumps(figures))
        if figures["max_first_token_logprob_diff"] > PARITY_BOUNDS["max_logprob_diff"]:
            failed.append(f"logprob difference {figures['max_first_token_logprob_diff']}")
        if figures["prompts_agreeing_8_tokens"] < PARITY_BOUNDS["min_prompts_agreeing"]:
            failed.append(f"{figures['prompts_agreeing_8_tokens']} prompts agreeing")
    result["speed"] = {backend: speed(model_dir, backend) for backend in SETUP["backends"]}
    result["parity_failures"] = failed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
