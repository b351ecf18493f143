"""Decode attention alone, compiled kernel vs gather path: ``python -m bench.decode_attention``.

One layer's decode attention for a batch of sequences (the demo model's
shape: 9 query heads, 3 kv heads, head_dim 64, blocks of 16), from a pool
whose blocks are shuffled as a long-running engine's are. Prints the mean
time per call of each path and their largest difference; asserts nothing.
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
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    dtype = getattr(torch, args.dtype)
    rng = random.Random(0)
    lens = sorted(rng.randint(args.min_len, args.max_len) for _ in range(args.sequences))
    num_blocks = sum(-(-n // block_size) for n in lens) * 2
    gen = torch.Generator().manual_seed(0)
    shape = (num_blocks, kv_heads, head_dim * block_size)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lens]
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    kv_lens = torch.tensor(lens)
    q = torch.randn(len(lens), heads, head_dim, generator=gen).to(dtype)
    no_new = torch.zeros(0, kv_heads, head_dim, dtype=dtype)
    outputs = {}
    kv_bytes = sum(lens) * kv_heads * head_dim * 2 * q.element_size()
    print(
        f"{len(lens)} sequences, contexts {args.min_len}..{args.max_len} "
        f"(mean {sum(lens) / len(lens):.0f}), {args.dtype}, {args.threads} threads, "
        f"{kv_bytes / 2**20:.1f} MiB of K+V per layer"
    )
    for name, use_kernel in (("kernel", True), ("gather", False)):
        backend = TorchAttentionBackend(heads, kv_heads, head_dim, block_size, use_kernel)
        if use_kernel and backend.kernel is None:
            print("kernel: unavailable (no compiler, or GPUWORKERS_CPU_KERNELS=0)")
            continue
        meta = TorchAttentionMetadata(
            num_decodes=len(lens),
            slot_mapping=torch.zeros(0, dtype=torch.long),
            decode_block_tables=block_tables,
            decode_kv_lens=kv_lens,
        )
        backend.metadata_builder.plan(meta, dtype)
        outputs[name] = backend.forward(q, no_new, no_new, k_cache, v_cache, meta)
        started = time.perf_counter()
        for _ in range(args.calls):
            backend.metadata_builder.plan(meta, dtype)
            backend.forward(q, no_new, no_new, k_cache, v_cache, meta)
        seconds = (time.perf_counter() - started) / args.calls
        print(
            f"{name}: {seconds * 1000:.2f} ms per layer call, "
            f"{kv_bytes / seconds / 1e9:.1f} GB/s of K+V"
        )
    if len(outputs) == 2:
        diff = (outputs["kernel"].float() - outputs["gather"].float()).abs().max().item()
        print(f"largest difference kernel vs gather: {diff:.2e}")


if __name__ == "__main__":
    main()
