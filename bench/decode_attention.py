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
"""

from __future__ import annotations

import argparse
import random
import time

import torch

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
    outputs = {}
    # Bytes each sequence's rows need (a sequence's blocks read once).
    kv_bytes = sum(n + extra for n in lens) * kv_heads * head_dim * 2 * q.element_size()
    print(
        f"{len(lens)} sequences, contexts {args.min_len}..{args.max_len} "
        f"(mean {sum(lens) / len(lens):.0f}), {len(row_lens)} query rows, {args.dtype}, "
        f"{args.threads} threads, {kv_bytes / 2**20:.1f} MiB of K+V per layer, "
        f"{args.layers} layer(s)"
    )
    for name, use_kernel in (("kernel", True), ("gather", False)):
        backend = TorchAttentionBackend(heads, kv_heads, head_dim, block_size, use_kernel)
        if use_kernel and backend.kernel is None:
            print("kernel: unavailable (no compiler, or GPUWORKERS_CPU_KERNELS=0)")
            continue
        meta = TorchAttentionMetadata(
            num_decodes=len(row_lens),
            slot_mapping=torch.zeros(0, dtype=torch.long),
            decode_block_tables=block_tables,
            decode_kv_lens=kv_lens,
        )
        backend.metadata_builder.plan(meta, dtype)
        outputs[name] = backend.forward(q, no_new, no_new, *pools[0], meta)
        times = []
        for call in range(args.calls):
            started = time.perf_counter()
            backend.metadata_builder.plan(meta, dtype)
            backend.forward(q, no_new, no_new, *pools[call % len(pools)], meta)
            times.append(time.perf_counter() - started)
        seconds, best = sum(times) / len(times), min(times)
        print(
            f"{name}: {seconds * 1000:.2f} ms per layer call, "
            f"{kv_bytes / seconds / 1e9:.1f} GB/s of K+V (best {best * 1000:.2f} ms, "
            f"{kv_bytes / best / 1e9:.1f} GB/s)"
        )
    if len(outputs) == 2:
        diff = (outputs["kernel"].float() - outputs["gather"].float()).abs().max().item()
        print(f"largest difference kernel vs gather: {diff:.2e}")


if __name__ == "__main__":
    main()
