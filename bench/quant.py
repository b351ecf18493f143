"""Quantized weights against the engine's default: ``python -m bench.quant``.

    python -m bench.quant [--prompts 24] [--max-tokens 48] [--passages 12]
                          [--repeat 2] [--threads 2] [--arms bf16,int8,...]
                          [--single-tokens 128] [--single-repeat 5] [--llamacpp]

Arms are EngineConfig overrides (``ARMS``): ``bf16`` is the engine's
default dtype here ("auto": bfloat16 where the CPU computes in it, float32
on AVX2-only CPUs; the name is the reference arm's, the JSON records the
dtype), ``int8`` adds weight-only int8 linears (``quantization="int8"``),
``int8+kv-int8`` also an int8 KV cache, through a ``kv_cache_dtype`` field
that the engine does not have yet: an arm whose field is missing, or whose
value EngineConfig rejects, is reported unavailable with the reason.
``--arms bf16,int8,fp32`` adds float32 weights and activations: how far
float32 strays from bfloat16's own greedy tokens, the yardstick for the
int8 arms' agreement.

Every available arm's engine is loaded in this process, and per arm:

Speculation is off in every arm: quantization changes a step's cost, and
that is what the tok/s compare.

- output tok/s: the same ``--prompts`` real chat messages
  (bench/data/chat_prompts.jsonl, through the chat template), greedy,
  ``--max-tokens`` each, one ``LLMEngine.generate`` batch; the arms' runs
  alternate ``--repeat`` times and the median counts;
- greedy agreement with the reference (first) arm on those outputs:
  ``prefix`` is the share of the reference's output positions before each
  output's first differing token, ``positions`` the share of positions
  that hold the same token (compared position by position over the
  shorter output), ``identical`` the share of outputs equal throughout;
- perplexity of ``--passages`` held-out passages of Jane Austen's novels
  (bench/data/edit_passages_austen.txt, public domain; not chat prompts),
  from the engine's prompt logprobs, and its ratio to the reference arm's;
- single-stream decode: one request alone, ``--single-tokens`` greedy
  tokens past EOS, speculation off (the step itself, as llama.cpp's
  ``llama-bench -n`` times it), tok/s from its first token to its last;
  the median of ``--single-repeat`` streams per arm, alternating between
  the arms (one stream's rate moves by more than the arms differ).

``--llamacpp`` adds llama.cpp's own formats of the same model (bf16, Q8_0,
Q4_0; bench/peers/install_llamacpp.sh builds them): ``llama-bench``'s
single-stream decode tok/s (``-p 0 -n --single-tokens``) and
``llama-perplexity`` over the same passages (its own windows of 256
tokens: compare its formats with each other, not with the engine's
figure).

Writes bench/results/quant.json and quant.txt (the command, the machine and
its load). A shared machine's tok/s are noise; the ratio of one
interleaved run is the figure to read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from bench.peers.launch import ROOT, machine_info
from bench.workloads import CHAT_PROMPTS, chat_messages, edit_passages

PASSAGES = ROOT / "bench" / "data" / "edit_passages_austen.txt"
RESULTS = ROOT / "bench" / "results"


@dataclasses.dataclass(slots=True)
class Arm:
    name: str
    overrides: dict


ARMS = [
    Arm("bf16", {}),
    Arm("int8", {"quantization": "int8"}),
    Arm("int8+kv-int8", {"quantization": "int8", "kv_cache_dtype": "int8"}),
    # Not run by default: how far float32 itself strays from bfloat16's
    # greedy tokens, the scale for the int8 arms' agreement.
    Arm("fp32", {"dtype": "float32"}),
]
DEFAULT_ARMS = "bf16,int8,int8+kv-int8"


@dataclasses.dataclass(slots=True)
class ArmResult:
    name: str
    overrides: dict
    available: bool
    reason: str = ""
    dtype: str = ""
    cpu_fast_paths: list[str] = dataclasses.field(default_factory=list)
    tok_s_runs: list[float] = dataclasses.field(default_factory=list)
    tok_s: float | None = None
    output_tokens: int = 0
    agreement_prefix: float | None = None
    agreement_positions: float | None = None
    identical_outputs: float | None = None
    perplexity: float | None = None
    perplexity_tokens: int = 0
    perplexity_ratio: float | None = None
    tok_s_ratio: float | None = None
    single_stream_tok_s: float | None = None  # the median of single_stream_runs
    single_stream_runs: list[float] = dataclasses.field(default_factory=list)


def progress(message: str) -> None:
    print(f"[quant] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.quant",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--passages", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--arms", default=DEFAULT_ARMS)
    parser.add_argument("--model", type=Path, default=None, help="default: the demo model")
    parser.add_argument("--single-tokens", type=int, default=128)
    parser.add_argument(
        "--single-repeat",
        type=int,
        default=5,
        help="single streams per arm, alternating between the arms (one stream moves by 20-40%%)",
    )
    parser.add_argument("--llamacpp", action="store_true", help="llama.cpp's formats beside ours")
    parser.add_argument("--out", type=Path, default=RESULTS / "quant.json")
    args = parser.parse_args(argv)
    known = {arm.name for arm in ARMS}
    chosen = args.arms.split(",")
    if not chosen or set(chosen) - known:
        parser.error(f"--arms: a comma-separated list of {', '.join(sorted(known))}")
    if min(args.prompts, args.max_tokens, args.passages, args.repeat, args.threads) < 1:
        parser.error("--prompts, --max-tokens, --passages, --repeat and --threads must be >= 1")
    if args.single_tokens < 2 or args.single_repeat < 1:
        parser.error("--single-tokens must be >= 2 and --single-repeat >= 1")
    return args


def unavailable_reason(arm: Arm, dtype: str) -> str:
    """Why EngineConfig cannot take ``arm``'s overrides; empty if it can."""
    from gpuworkers.engine.config import EngineConfig

    fields = {field.name for field in dataclasses.fields(EngineConfig)}
    missing = sorted(set(arm.overrides) - fields)
    if missing:
        return f"EngineConfig has no field {', '.join(missing)}"
    try:
        EngineConfig(**{"dtype": dtype, **arm.overrides})
    except (TypeError, ValueError) as exc:
        return f"EngineConfig rejects it: {exc}"
    return ""


def agreement(reference: list[list[int]], outputs: list[list[int]]) -> tuple[float, float, float]:
    """(prefix, positions, identical) shares, as the module docstring says."""
    total = sum(len(ref) for ref in reference) or 1
    prefix = same = identical = 0
    for ref, out in zip(reference, outputs, strict=True):
        pairs = list(zip(ref, out, strict=False))
        first_difference = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
        prefix += first_difference
        same += sum(a == b for a, b in pairs)
        identical += ref == out
    return prefix / total, same / total, identical / len(reference)


def perplexity(engine, passages: list[list[int]]) -> tuple[float, int]:
    """exp(mean negative log-likelihood) over every predicted passage token."""
    from gpuworkers.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    results = engine.generate(passages, params)
    total, count = 0.0, 0
    for result in results:
        entries = result.prompt_logprobs or []
        # The first token has none; a cached one would have none either:
        # count only what was computed, and say how many.
        for entry in entries[1:]:
            if entry is None:
                raise RuntimeError("a passage token came from the prefix cache: no logprob")
            total -= entry.logprob
            count += 1
    return math.exp(total / count), count


def single_stream_tok_s(engine, prompt: list[int], tokens: int) -> float:
    """Decode tok/s of one request alone, from its first token to its last."""
    from gpuworkers.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.add_request("single-stream", prompt, params)
    times = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            now = time.perf_counter()
            times.extend(now for _ in output.choices[0].token_ids)
    return (len(times) - 1) / (times[-1] - times[0])


def llamacpp_rows(args: argparse.Namespace, passages: list[str]) -> list[dict]:
    """llama.cpp's formats: single-stream decode tok/s and perplexity."""
    import tempfile

    from bench.peers.llamacpp_runner import FORMATS, LlamaCppTools, decode_speed, perplexity

    tools = LlamaCppTools.find()
    if tools is None:
        raise SystemExit("--llamacpp: run bash bench/peers/install_llamacpp.sh first")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as text:
        text.write("\n\n".join(passages))
    rows = []
    for fmt in FORMATS:
        progress(f"llama.cpp {fmt}: llama-bench and llama-perplexity")
        speed = decode_speed(tools, fmt, args.threads, args.single_tokens, reps=3)
        ppl = perplexity(tools, fmt, Path(text.name), args.threads, ctx=256)
        rows.append(
            {
                "format": fmt,
                "single_stream_tok_s": round(speed.tok_per_s, 2),
                "single_stream_stddev": round(speed.stddev, 2),
                "perplexity_ctx256": ppl,
            }
        )
    Path(text.name).unlink()
    for row in rows:
        row["perplexity_ratio"] = round(row["perplexity_ctx256"] / rows[0]["perplexity_ctx256"], 5)
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    load_before = os.getloadavg()
    import torch

    from gpuworkers.engine import LLMEngine
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from gpuworkers.engine.dtypes import resolve_dtype
    from gpuworkers.engine.sampling_params import SamplingParams
    from tokenization.tokenizer import apply_chat_template

    torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_demo_model()
    dtype = resolve_dtype(args.dtype, "cpu")
    arms = [arm for arm in ARMS if arm.name in args.arms.split(",")]
    results, engines = [], {}
    for arm in arms:
        reason = unavailable_reason(arm, dtype)
        arm_dtype = resolve_dtype(arm.overrides.get("dtype", dtype), "cpu")
        results.append(ArmResult(arm.name, arm.overrides, not reason, reason, arm_dtype))
        if reason:
            progress(f"{arm.name}: unavailable ({reason})")
            continue
        progress(f"{arm.name}: loading {model_dir}")
        engine = LLMEngine.from_pretrained(
            model_dir,
            **{
                "dtype": dtype,
                "kv_cache_bytes": 256 << 20,
                # Every arm's step alone: what quantization changes is the
                # step's cost, and llama-bench drafts nothing either.
                "speculative_method": None,
                **arm.overrides,
            },
        )
        engine.warmup()
        engines[arm.name] = engine
        results[-1].cpu_fast_paths = engine.cpu_fast_paths
    if not engines:
        raise SystemExit("no arm is available")
    tokenizer = next(iter(engines.values())).tokenizer
    messages = chat_messages()[: args.prompts]
    prompts = [apply_chat_template(tokenizer, [{"role": "user", "content": m}]) for m in messages]
    passage_texts = edit_passages(PASSAGES)[: args.passages]
    passages = [tokenizer(text).input_ids for text in passage_texts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    outputs: dict[str, list[list[int]]] = {}
    by_name = {result.name: result for result in results}
    for name, engine in engines.items():
        progress(f"{name}: perplexity of {len(passages)} passages")
        by_name[name].perplexity, by_name[name].perplexity_tokens = perplexity(engine, passages)
    for run in range(args.repeat):
        for name, engine in engines.items():
            started = time.perf_counter()
            generated = engine.generate(prompts, params)
            seconds = time.perf_counter() - started
            tokens = [list(g.token_ids) for g in generated]
            produced = sum(len(t) for t in tokens)
            by_name[name].tok_s_runs.append(round(produced / seconds, 2))
            by_name[name].output_tokens = produced
            outputs[name] = tokens
            progress(f"{name}: run {run + 1}: {produced} tokens, {produced / seconds:.1f} tok/s")
    # One 128-token stream's rate moves by 20-40% from one to the next in
    # the same process, more than the arms differ: alternate the arms and
    # keep the median.
    for run in range(args.single_repeat):
        for name, engine in engines.items():
            rate = single_stream_tok_s(engine, prompts[0], args.single_tokens)
            by_name[name].single_stream_runs.append(round(rate, 2))
            progress(f"{name}: single stream {run + 1}: {rate:.1f} tok/s")
    for name in engines:
        by_name[name].single_stream_tok_s = round(
            statistics.median(by_name[name].single_stream_runs), 2
        )
    llamacpp = llamacpp_rows(args, passage_texts) if args.llamacpp else []
    reference = results[0] if results[0].available else None
    for result in results:
        if not result.available:
            continue
        result.tok_s = round(statistics.median(result.tok_s_runs), 2)
        if reference is not None:
            prefix, positions, identical = agreement(outputs[reference.name], outputs[result.name])
            result.agreement_prefix = round(prefix, 4)
            result.agreement_positions = round(positions, 4)
            result.identical_outputs = round(identical, 4)
            result.perplexity_ratio = round(result.perplexity / reference.perplexity, 5)
            result.tok_s_ratio = round(result.tok_s / reference.tok_s, 3)
        result.perplexity = round(result.perplexity, 4)
    command = "python -m bench.quant " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {
        "command": command.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(load_before),
        "threads": args.threads,
        "dtype": dtype,
        "model": Path(model_dir).name,
        "workload": {
            "prompts": len(prompts),
            "prompts_from": str(CHAT_PROMPTS.relative_to(ROOT)),
            "max_tokens": args.max_tokens,
            "greedy": True,
            "repeat": args.repeat,
            "perplexity_passages": len(passages),
            "perplexity_text": str(PASSAGES.relative_to(ROOT)),
            "speculation": None,
            "single_stream_tokens": args.single_tokens,
            "single_stream_repeat": args.single_repeat,
        },
        "reference_arm": reference.name if reference else None,
        "arms": [dataclasses.asdict(result) for result in results],
        "llamacpp": llamacpp,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    text = render(report)
    args.out.with_suffix(".txt").write_text(text)
    print(text, end="")


def render(report: dict) -> str:
    machine = report["machine"]
    lines = [
        f"# {report['command']} ({report['date']}, {machine['cpu']}, {machine['nproc']} CPUs,"
        f" {report['threads']} threads, load average {machine['loadavg_before'][0]} before,"
        f" {machine['loadavg_after'][0]} after)",
        f"# {report['model']}, dtype {report['dtype']}; {report['workload']['prompts']} chat"
        f" prompts x {report['workload']['max_tokens']} greedy tokens, median of"
        f" {report['workload']['repeat']} alternating runs; perplexity over"
        f" {report['workload']['perplexity_passages']} passages of"
        f" {report['workload']['perplexity_text']}; 1-strm: one request alone,"
        f" {report['workload']['single_stream_tokens']} tokens, decode tok/s, median of"
        f" {report['workload'].get('single_stream_repeat', 1)} alternating streams",
        f"{'arm':14} {'tok/s':>8} {'x ref':>6} {'1-strm':>7} {'prefix':>7} {'posns':>7}"
        f" {'ident':>6} {'ppl':>8} {'ppl x ref':>9}  dtype: CPU fast paths",
    ]

    def cell(value, spec: str, width: int) -> str:
        return f"{value:{spec}}" if value is not None else "-".rjust(width)

    for arm in report["arms"]:
        if not arm["available"]:
            lines.append(f"{arm['name']:14} unavailable: {arm['reason']}")
            continue
        lines.append(
            f"{arm['name']:14} {cell(arm['tok_s'], '8.1f', 8)} {cell(arm['tok_s_ratio'], '6.3f', 6)}"
            f" {cell(arm['single_stream_tok_s'], '7.1f', 7)}"
            f" {cell(arm['agreement_prefix'], '7.3f', 7)}"
            f" {cell(arm['agreement_positions'], '7.3f', 7)}"
            f" {cell(arm['identical_outputs'], '6.2f', 6)} {cell(arm['perplexity'], '8.3f', 8)}"
            f" {cell(arm['perplexity_ratio'], '9.4f', 9)}  {arm['dtype']}:"
            f" {', '.join(arm['cpu_fast_paths']) or 'plain torch'}"
        )
    if report["llamacpp"]:
        lines.append(
            "# llama.cpp (llama-bench -p 0 -n tokens, 3 repetitions; llama-perplexity -c 256"
            " over the same passages)"
        )
        lines.append(f"{'format':14} {'1-strm':>8} {'+-':>6} {'ppl':>8} {'ppl x bf16':>10}")
        for row in report["llamacpp"]:
            lines.append(
                f"{row['format']:14} {row['single_stream_tok_s']:8.1f}"
                f" {row['single_stream_stddev']:6.1f} {row['perplexity_ctx256']:8.3f}"
                f" {row['perplexity_ratio']:10.4f}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
