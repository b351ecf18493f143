"""Side-by-side engine benchmark: this engine, vLLM's CPU build, HF ``generate``.

    python -m bench.engine [--quick] [--repeat N] [--threads T]
                           [--skip-vllm] [--skip-hf] [--skip-engine]

One run, one seeded workload, one dtype for every peer (what the engine's
"auto" resolves to here: bfloat16, or float32 on AVX2-only CPUs). Each peer
runs in its own subprocess (vLLM in its own virtualenv, made by
bench/peers/install_vllm.sh) and reads the same prompts, as token ids, from
a JSON file. Figures go to stdout as a table and to bench/results/engine.json
(engine-quick.json with --quick); progress goes to stderr. See the README's
"Engine benchmark" section for what each figure means.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.flops import ModelShape
from bench.peers.launch import ROOT, VLLM_PYTHON, machine_info, run_peer, runner_command
from bench.report import print_report, summarize
from bench.workloads import FULL, QUICK, build_workload, plain_token_ids
from gpuworkers.engine.dtypes import resolve_dtype


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small workload for a smoke run")
    parser.add_argument(
        "--repeat", type=int, default=None, help="offline runs per peer, median taken (3; 1 quick)"
    )
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-vllm", action="store_true")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument(
        "--hf-repeat", type=int, default=None, help="offline runs for HF alone (default: --repeat)"
    )
    parser.add_argument("--kv-cache-gib", type=float, default=2.0, help="KV budget, every peer")
    parser.add_argument(
        "--engine-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="extra LLMEngine.from_pretrained option, e.g. max_num_batched_tokens=1024",
    )
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.hf_repeat is None:
        args.hf_repeat = args.repeat
    if args.out is None:
        name = "engine-quick.json" if args.quick else "engine.json"
        args.out = ROOT / "bench" / "results" / name
    return args


def engine_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.skip_vllm and not args.vllm_python.exists():
        print(
            f"vLLM's virtualenv is missing ({args.vllm_python}).\n"
            "Install it once with: bash bench/peers/install_vllm.sh  (about 3 min, 3.4 GB)\n"
            "or run without vLLM: python -m bench.engine --skip-vllm",
            file=sys.stderr,
        )
        return 2
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from tokenization.tokenizer import load_tokenizer

    started = time.time()
    load_before = os.getloadavg()
    shape = QUICK if args.quick else FULL
    model_dir = Path(ensure_demo_model())
    tokenizer = load_tokenizer(str(model_dir))
    # Ids past the model's embedding table would crash every peer alike.
    vocab_size = min(len(tokenizer), ModelShape.from_dir(model_dir).vocab)
    workload = build_workload(
        shape,
        allowed_ids=plain_token_ids(tokenizer, vocab_size),
        vocab_size=vocab_size,
        seed=args.seed,
    )
    progress(
        f"workload ({'quick' if args.quick else 'full'}, seed {args.seed}): "
        f"{len(workload.offline)} offline requests, {len(workload.conversations)} "
        f"conversations; {args.threads} threads, bfloat16, repeat {args.repeat}"
    )
    common = {"model_dir": model_dir, "threads": args.threads}
    runner = {
        **common,
        "repeat": args.repeat,
        "kv_cache_gib": args.kv_cache_gib,
        "dtype": resolve_dtype("auto", "cpu"),
    }
    peers: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        workload_path = Path(tmp) / "workload.json"
        workload.to_json(workload_path)
        runner["workload"] = workload_path
        plan = [("peak", sys.executable, "bench.flops", common)]
        if not args.skip_engine:
            options = json.dumps(engine_options(args.engine_option))
            plan.append(
                (
                    "engine",
                    sys.executable,
                    "bench.peers.engine_runner",
                    {**runner, "engine_options": options},
                )
            )
        if not args.skip_vllm:
            plan.append(("vllm", str(args.vllm_python), "bench.peers.vllm_runner", runner))
        if not args.skip_hf:
            plan.append(
                (
                    "hf",
                    sys.executable,
                    "bench.peers.hf_runner",
                    {
                        **runner,
                        "repeat": args.hf_repeat,
                        "phases": "offline",
                        "hf_batch_size": args.hf_batch_size,
                    },
                )
            )
        for index, (name, python, module, options) in enumerate(plan, 1):
            progress(f"{index}/{len(plan)}: {name}")
            out = Path(tmp) / f"{name}.json"
            command = runner_command(python, module, out, **options)
            peers[name] = run_peer(
                name, command, out, threads=args.threads, thread_env=name != "vllm"
            )
    summary = summarize(peers)
    summary.update(
        workload={
            "quick": args.quick,
            "seed": args.seed,
            "shape": dataclasses.asdict(shape),
        },
        dtype=resolve_dtype("auto", "cpu"),
        threads=args.threads,
        repeat=args.repeat,
        hf_repeat=args.hf_repeat,
        kv_cache_gib=args.kv_cache_gib,
        machine=machine_info(load_before),
        command=" ".join(["python", "-m", "bench.engine", *(argv or sys.argv[1:])]),
        timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        wall_s=round(time.time() - started, 1),
        peers=peers,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print_report(summary)
    progress(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    failed = [name for name, result in peers.items() if "error" in result]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
