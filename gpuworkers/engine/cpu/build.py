"""Build, cache and load the engine's CPU kernels (the *.cpp files here).

They are compiled on first use for this machine (``-march=native``: the
fleet's CPUs differ, so the build is cached per CPU model and flags) into
one shared library, loaded with ctypes. Without a C++ compiler, or if the
build fails, callers get ``None`` and keep plain torch; the reason is logged
once. Set GPUWORKERS_CPU_KERNELS=0 to use plain torch everywhere.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = sorted(Path(__file__).parent.glob("*.cpp"))
# Headers are part of the cache key too: a changed header must rebuild.
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
# -ffast-math lets gcc vectorise expf (glibc's libmvec) and reassociate sums.
# It is for compiling only: linking a shared library with it pulls in
# crtfastmath.o, which turns on flush-to-zero for the whole process at load
# time (every float op in torch and Python would lose subnormals; caught by
# schemathesis' hypothesis, tested in test_cpu_fast_paths.py).
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c++17"]
LINK_FLAGS = ["-shared", "-fopenmp", "-lm"]
ENV_SWITCH = "GPUWORKERS_CPU_KERNELS"
ENV_CACHE = "GPUWORKERS_KERNEL_CACHE"
# Seconds one compile may take (about 25 s for the slowest file on an idle
# core); an image build on a busy host sets more (docker/Dockerfile).
ENV_TIMEOUT = "GPUWORKERS_KERNEL_BUILD_TIMEOUT"

_lock = threading.Lock()
_loaded: dict[str, object] = {}


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuworkers"
    return Path(os.environ.get(ENV_CACHE) or default / "kernels")


def _cpu_identity() -> str:
    """Model name and feature flags: what -march=native compiles for."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags")
    lines = [line for line in text.splitlines() if line.split(":")[0].strip() in wanted]
    return "\n".join(sorted(set(lines)))


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")


def _build(compiler: str) -> Path:
    source = b"\0".join(path.read_bytes() for path in SOURCES + HEADERS)
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(
        b"\0".join(
            [
                source,
                " ".join(COMPILE_FLAGS + LINK_FLAGS).encode(),
                version.encode(),
                _cpu_identity().encode(),
            ]
        )
    ).hexdigest()[:16]
    target = cache_dir() / f"engine-cpu-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target, then rename: processes racing to build the
    # same kernel each publish a complete file.
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, suffix=".objects.partial") as tmp:
            objects = [str(Path(tmp) / f"{path.stem}.o") for path in SOURCES]
            commands = [
                [compiler, *COMPILE_FLAGS, "-c", str(path), "-o", obj]
                for path, obj in zip(SOURCES, objects, strict=True)
            ]
            # In parallel: the AVX-512 decode kernel's template instances
            # alone take ~25 s; the others overlap with it.
            with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
                for future in [pool.submit(_run, command) for command in commands]:
                    future.result()
            _run([compiler, *objects, *LINK_FLAGS, "-o", partial])
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _run(command: list[str]) -> None:
    timeout = float(os.environ.get(ENV_TIMEOUT) or 120)
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=timeout)


def _load() -> object | None:
    compiler = _compiler()
    if compiler is None:
        log.warning("no C++ compiler found: the engine's CPU kernels fall back to torch")
        return None
    try:
        path = _build(compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.warning("CPU kernel build failed, falling back to torch: %s", detail)
        return None
    lib = ctypes.CDLL(str(path))
    pointer, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    signatures = {
        "paged_decode_supported": ([i32] * 4, i32),
        # kind (bit 0: bfloat16 queries, bit 1: int8 pool), q, q_stride, k, v, tables, table_stride, table rows, lens,
        # out, seqs, heads, kv_heads, head_dim, block_size, block/head
        # stride, scale
        "paged_decode": (
            [i32, pointer, i64, pointer, pointer, pointer, i64, pointer, pointer, pointer]
            + [i32] * 5
            + [i64, i64, f32],
            i32,
        ),
        # element size, k, k row stride, v, v row stride, slots, tokens, keys,
        # values, kv_heads, head_dim, block_size, block/head stride
        "write_kv_cache": (
            [i32, pointer, i64, pointer, i64, pointer, i64, pointer, pointer] + [i64] * 5,
            None,
        ),
        # the same, quantizing into an int8 pool (strides of the pool in bytes)
        "write_kv_cache_int8": (
            [i32, pointer, i64, pointer, i64, pointer, i64, pointer, pointer] + [i64] * 5,
            None,
        ),
        "prefill_attention_supported": ([i32] * 3, i32),
        # q, q row stride, k, v, block table, q_len, kv_len, out, heads,
        # kv_heads, head_dim, block_size, block/head stride, scale
        "prefill_attention": (
            [pointer, i64, pointer, pointer, pointer, i64, i64, pointer]
            + [i32] * 4
            + [i64, i64, f32],
            i32,
        ),
        "rms_norm_bf16": ([pointer] * 4 + [i64] * 3 + [f32], None),
        "rotary_bf16": ([pointer] + [i64] * 4 + [pointer] * 3, None),
        "silu_and_mul_bf16": ([pointer, pointer, i64, i64], None),
        "amx_linear_supported": ([], i32),
        "amx_linear_k_multiple": ([], i32),
        # x, rows, x row stride, in, packed weight, float32 bias, out, out features
        "amx_linear_bf16": ([pointer, i64, i64, i64, pointer, pointer, pointer, i64], None),
        "amx_swiglu_bf16": ([pointer, i64, i64, i64, pointer, pointer, i64], None),
        "dpbf16_linear_supported": ([], i32),
        "dpbf16_linear_k_multiple": ([], i32),
        "dpbf16_linear_bf16": ([pointer, i64, i64, i64, pointer, pointer, pointer, i64], None),
        "dpbf16_swiglu_bf16": ([pointer, i64, i64, i64, pointer, pointer, i64], None),
        # x, rows, x row stride, in, int8 packed weight, float32 scales,
        # float32 bias, out, out features
        "amx_linear_int8": (
            [pointer, i64, i64, i64, pointer, pointer, pointer, pointer, i64],
            None,
        ),
        "amx_swiglu_int8": ([pointer, i64, i64, i64, pointer, pointer, pointer, i64], None),
        "dpbf16_linear_int8": ([pointer, i64, i64, i64] + [pointer] * 4 + [i64], None),
        "dpbf16_swiglu_int8": ([pointer, i64, i64, i64, pointer, pointer, pointer, i64], None),
        # linear kind, kv_int8, layers, weights, rows, hidden, q, kv,
        # intermediate, eps, residual, delta, normed, qkv, attn, act,
        # positions, cos, sin, cache, layer stride, K-to-V stride, block
        # stride, head stride, slots, tables, table stride, table rows, lens,
        # heads, kv_heads, head_dim, block_size, scale
        "decode_layers": (
            [i32, i32, i64, pointer]
            + [i64] * 5
            + [f32]
            + [pointer] * 10
            + [i64] * 4
            + [pointer, pointer, i64, pointer, pointer]
            + [i32] * 4
            + [f32],
            i32,
        ),
    }
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


def cpu_library() -> object | None:
    """The loaded kernel library, building it on first call; None if unavailable."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _load()
        return _loaded["lib"]
