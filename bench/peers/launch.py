"""Start one peer runner in its own subprocess and collect its JSON result.

The runner's stdout and stderr are relayed to this process's stderr as they
come (the progress lines), less vLLM's one-warning-per-weight flood, so that
stdout keeps only the final table.
"""

from __future__ import annotations

import collections
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".peers" / "vllm-venv" / "bin" / "python"
# Debian's libtcmalloc-minimal4 (bench/peers/install_vllm.sh installs it).
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")

# Lines that say nothing about the benchmark (vLLM warns once per weight
# that a float32 checkpoint is cast to bfloat16).
NOISE = ("Attempted to load weight",)


def runner_command(python: str, module: str, out: Path, **options) -> list[str]:
    command = [python, "-m", module, "--out", str(out)]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    return command


def run_peer(
    name: str, command: list[str], out: Path, *, threads: int, thread_env: bool = True
) -> dict:
    """Run ``command`` from the repo root; its result, or an error and log tail.

    ``thread_env=False`` leaves OMP_NUM_THREADS unset: vLLM then keeps its
    scheduling processes at one torch thread and binds the worker's OpenMP
    threads itself (VLLM_CPU_OMP_THREADS_BIND); with the variable set, every
    one of its processes spins that many threads on the same two cores.
    """
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("MKL_NUM_THREADS", None)
    if thread_env:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if not thread_env and TCMALLOC.exists():
        # vLLM's CPU documentation asks for tcmalloc preloaded.
        env["LD_PRELOAD"] = os.pathsep.join(filter(None, [str(TCMALLOC), env.get("LD_PRELOAD")]))
    env.update(
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    tail: collections.deque[str] = collections.deque(maxlen=40)
    started = time.perf_counter()
    with subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if any(noise in line for noise in NOISE):
                continue
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()
    wall_s = round(time.perf_counter() - started, 1)
    if proc.returncode != 0 or not out.exists():
        print(f"[bench] {name} failed (exit {proc.returncode})", file=sys.stderr)
        return {"error": f"exit {proc.returncode}", "log_tail": list(tail), "wall_s": wall_s}
    result = json.loads(out.read_text())
    result["wall_s"] = wall_s
    return result


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_info(load_before: tuple[float, float, float]) -> dict:
    """What the figures were measured on, and how busy the machine was."""
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        # A 1-minute load above the thread count means other work shared
        # the cores: treat the figures as noise (shared/PEERS.md).
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
