"""Decode attention alone, compiled kernel vs gather path: ``python -m bench.decode_attention``.

One layer's decode attention for a batch of sequences (the demo model's
shape: 9 query heads, 3 kv heads, head_dim 64, blocks of 16), from a pool
whose blocks are shuffled as a long-running engine's are. Prints the mean
(and best) time per call of each path and their largest difference;
asserts nothing.

``--draft-rows K`` makes each sequence a speculative verification: K + 1
query rows over its blocks with lengths L .. L + K, each row with its own
copy of the table (as the metadata builds them). ``--layers N`` cycles
through N pools, as a step's layers do: with enough of them, K/V comes from
DRAM rather than the last-level cache (the demo model's 30 layers of a
32-sequence batch are ~150 MB).

``--kv-cache-dtype int8`` runs both paths over an int8 pool (the same
values quantized, EngineConfig.kv_cache_dtype); ``both`` runs the model
dtype's pool and the int8 one, calls interleaved, and prints the ratio.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from gpuworkers.engine.attention import kv_int8
from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend
from gpuworkers.engine.attention.torch_metadata import TorchAttentionMetadata


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--draft-rows", type=int, default=0)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8", "both"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    dtype = getattr(torch, args.dtype)
    rng = random.Random(0)
    lens = sorted(rng.randint(args.min_len, args.max_len) for _ in range(args.sequences))
    extra = args.draft_rows
    num_blocks = sum(-(-(n + extra) // block_size) for n in lens) * 2
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks, kv_heads, head_dim * block_size)
    pools = [
        (torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
        for _ in range(args.layers)
    ]
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-(n + extra) // block_size))] for n in lens]
    # One row per (sequence, draft position): lengths L .. L + K, tables copied.
    row_tables = [t for t in tables for _ in range(extra + 1)]
    row_lens = [n + j for n in lens for j in range(extra + 1)]
    width = max(len(t) for t in row_tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in row_tables])
    kv_lens = torch.tensor(row_lens)
    q = torch.randn(len(row_lens), heads, head_dim, generator=gen).to(dtype)
    no_new = torch.zeros(0, kv_heads, head_dim, dtype=dtype)
    # Bytes each sequence's rows need (a sequence's blocks read once).
    tokens = sum(n + extra for n in lens) * kv_heads
    pool_bytes = {
        "auto": tokens * head_dim * 2 * q.element_size(),
        "int8": tokens * (head_dim + kv_int8.SCALE_BYTES) * 2,
    }
    kinds = ["auto", "int8"] if args.kv_cache_dtype == "both" else [args.kv_cache_dtype]
    print(
        f"{len(lens)} sequences, contexts {args.min_len}..{args.max_len} "
        f"(mean {sum(lens) / len(lens):.0f}), {len(row_lens)} query rows, {args.dtype}, "
        f"{args.threads} threads, {args.layers} layer(s), K+V per layer: "
        + ", ".join(f"{pool_bytes[k] / 2**20:.1f} MiB {k}" for k in kinds)
    )
    runs = {}
    for kind in kinds:
        kind_pools = (
            pools if kind == "auto" else [int8_pool(k, v, heads, kv_heads) for k, v in pools]
        )
        for name, use_kernel in (("kernel", True), ("gather", False)):
            backend = TorchAttentionBackend(
                heads, kv_heads, head_dim, block_size, use_kernel, kv_cache_dtype=kind
            )
            if use_kernel and backend.kernel is None:
                print("kernel: unavailable (no compiler, or GPUWORKERS_CPU_KERNELS=0)")
                continue
            meta = TorchAttentionMetadata(
                num_decodes=len(row_lens),
                slot_mapping=torch.zeros(0, dtype=torch.long),
                decode_block_tables=block_tables,
                decode_kv_lens=kv_lens,
            )
            runs[kind, name] = (backend, meta, kind_pools, [])
    outputs = {}
    for (kind, name), (backend, meta, kind_pools, _) in runs.items():
        backend.metadata_builder.plan(meta, dtype)
        outputs[kind, name] = backend.forward(q, no_new, no_new, *kind_pools[0], meta)
    # Calls interleaved across the runs: a busy machine slows them alike.
    for call in range(args.calls):
        for backend, meta, kind_pools, times in runs.values():
            started = time.perf_counter()
            backend.metadata_builder.plan(meta, dtype)
            backend.forward(q, no_new, no_new, *kind_pools[call % len(kind_pools)], meta)
            times.append(time.perf_counter() - started)
    means = {}
    for (kind, name), (_, _, _, times) in runs.items():
        seconds, best = sum(times) / len(times), min(times)
        means[kind, name] = seconds
        kv_bytes = pool_bytes[kind]
        print(
            f"{name} ({kind} pool): {seconds * 1000:.2f} ms per layer call, "
            f"{kv_bytes / seconds / 1e9:.1f} GB/s of K+V (best {best * 1000:.2f} ms, "
            f"{kv_bytes / best / 1e9:.1f} GB/s)"
        )
    for kind in kinds:
        if (kind, "kernel") in outputs and (kind, "gather") in outputs:
            diff = (outputs[kind, "kernel"].float() - outputs[kind, "gather"].float()).abs().max()
            print(f"largest difference kernel vs gather ({kind} pool): {diff.item():.2e}")
    if len(kinds) == 2:
        for name in ("kernel", "gather"):
            if ("auto", name) in means and ("int8", name) in means:
                ratio = means["auto", name] / means["int8", name]
                print(f"{name}: int8 pool {ratio:.2f}x the speed of the {args.dtype} pool")
        if ("auto", "kernel") in outputs and ("int8", "kernel") in outputs:
            diff = (outputs["auto", "kernel"].float() - outputs["int8", "kernel"].float()).abs()
            print(f"int8 vs {args.dtype} pool, kernel output: largest difference {diff.max():.2e}")


def int8_pool(k_cache, v_cache, heads, kv_heads):
    """The same keys and values in an int8 pool (the backend's layout)."""
    head_dim, block_size = 64, 16
    backend = TorchAttentionBackend(heads, kv_heads, head_dim, block_size, False, "int8")
    blocks = k_cache.shape[0]
    shape = (blocks, *backend.cache_block_shape())
    k8, v8 = torch.zeros(shape, dtype=torch.int8), torch.zeros(shape, dtype=torch.int8)
    keys, values = backend._views(k8, v8)
    key_scales, value_scales = backend._scales(k8, v8)
    float_keys = k_cache.float().view(blocks, kv_heads, head_dim, block_size).transpose(2, 3)
    quantized, scales = kv_int8.quantize_rows(float_keys)
    keys.copy_(quantized.transpose(2, 3))
    key_scales.copy_(scales)
    quantized, scales = kv_int8.quantize_rows(
        v_cache.float().view(blocks, kv_heads, block_size, head_dim)
    )
    values.copy_(quantized)
    value_scales.copy_(scales)
    return k8, v8


if __name__ == "__main__":
    main()
