"""Prefill attention alone, SDPA vs compiled kernel: ``python -m bench.prefill_attention``.

One layer's attention for one sequence's chunk of ``--lens`` tokens after
``--context`` cached tokens (every combination), in the demo model's shape
(9 query heads, 3 kv heads, head_dim 64, blocks of 16, bfloat16), from a
pool whose blocks are shuffled. Both paths are the torch backend's own: the
compiled kernel reading the pool in place, and SDPA as the backend calls it
(on the fresh K/V without context; after context, the gather out of the pool
and SDPA in query tiles with causal masks). Calls alternate between the two;
prints the median ms per call, GFLOP/s (useful causal FLOPs: 4 * head_dim *
heads * keys seen summed over queries) and the largest difference between
the two outputs; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from bench.peers.launch import cpu_model
from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend
from gpuworkers.engine.attention.torch_metadata import PrefillSpan

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def shape_case(length: int, context: int, gen: torch.Generator):
    """Pool, block table, the chunk's q/k/v ([len, heads, dim]) with its K/V
    also in the pool after the context's, as the backend has them."""
    total = context + length
    blocks = -(-total // BLOCK)
    k_cache = torch.randn(blocks + 4, KV_HEADS, HEAD_DIM, BLOCK, generator=gen).bfloat16()
    v_cache = torch.randn(blocks + 4, KV_HEADS, BLOCK, HEAD_DIM, generator=gen).bfloat16()
    order = list(range(blocks + 4))
    random.Random(total).shuffle(order)
    table = torch.tensor(order[:blocks])
    q = torch.randn(length, HEADS, HEAD_DIM, generator=gen).bfloat16()
    keys = k_cache[table].permute(1, 0, 3, 2).reshape(KV_HEADS, -1, HEAD_DIM)[:, :total]
    values = v_cache[table].transpose(0, 1).reshape(KV_HEADS, -1, HEAD_DIM)[:, :total]
    k = keys[:, context:].transpose(0, 1).contiguous()
    v = values[:, context:].transpose(0, 1).contiguous()
    return k_cache, v_cache, table, q, k, v


def time_shape(length, context, args, sdpa_backend, kernel, gen) -> str:
    """One table row: both paths' median ms and GFLOP/s, speedup, max |diff|."""
    k_cache, v_cache, table, q, k, v = shape_case(length, context, gen)
    keys, values = sdpa_backend._views(k_cache, v_cache)
    span = PrefillSpan(0, length, context, table)
    sdpa_out = torch.empty_like(q)
    kernel_out = torch.empty_like(q)

    def sdpa():
        if context == 0:
            kt, vt = k.transpose(0, 1), v.transpose(0, 1)
            sdpa_out[:] = sdpa_backend._attend(q, kt, vt, None, causal=True)
        else:
            sdpa_backend._attend_after_context(q, keys, values, span, sdpa_out)

    def compiled():
        kernel(q, keys, values, table, context + length, out=kernel_out)

    paths = [sdpa] + ([compiled] if kernel else [])
    times = {path: [] for path in paths}
    for call in range(args.warmup + args.repeats):
        for path in paths:
            started = time.perf_counter()
            path()
            if call >= args.warmup:
                times[path].append(time.perf_counter() - started)
    flops = 4 * HEAD_DIM * HEADS * (length * context + length * (length + 1) / 2)
    sdpa_s = statistics.median(times[sdpa])
    row = f"{length:>6} {context:>7} | {sdpa_s * 1e3:>8.3f} {flops / sdpa_s / 1e9:>7.1f} | "
    if not kernel:
        return row
    kernel_s = statistics.median(times[compiled])
    diff = (kernel_out.float() - sdpa_out.float()).abs().max().item()
    return row + (
        f"{kernel_s * 1e3:>9.3f} {flops / kernel_s / 1e9:>7.1f} | "
        f"{sdpa_s / kernel_s:>6.1f}x | {diff:.1e}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lens", type=ints, default=[128, 414, 1024, 2048])
    parser.add_argument("--context", type=ints, default=[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"{cpu_model()}, {args.threads} threads, torch {torch.__version__}, "
        f"load average at start {os.getloadavg()[0]:.2f}; {HEADS} heads over {KV_HEADS} kv "
        f"heads, head_dim {HEAD_DIM}, blocks of {BLOCK}, bfloat16; median of "
        f"{args.repeats} calls after {args.warmup}"
    )
    kernel_backend = TorchAttentionBackend(HEADS, KV_HEADS, HEAD_DIM, BLOCK)
    sdpa_backend = TorchAttentionBackend(HEADS, KV_HEADS, HEAD_DIM, BLOCK, use_kernel=False)
    kernel = kernel_backend.prefill_kernel
    if kernel is None or not kernel.supports(torch.bfloat16, torch.device("cpu")):
        print("kernel: unavailable (no compiler, no AVX512_BF16, or GPUWORKERS_CPU_KERNELS=0)")
        kernel = None
    gen = torch.Generator().manual_seed(0)
    print(
        f"{'tokens':>6} {'context':>7} | {'SDPA ms':>8} {'GFLOP/s':>7} | "
        f"{'kernel ms':>9} {'GFLOP/s':>7} | {'speedup':>7} | max |diff|"
    )
    for context in args.context:
        for length in args.lens:
            print(time_shape(length, context, args, sdpa_backend, kernel, gen), flush=True)


if __name__ == "__main__":
    main()
