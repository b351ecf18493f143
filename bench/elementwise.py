"""Fused element-wise ops vs the torch eager code they replace: ``python -m bench.elementwise``.

Times one layer's rms_norm (with and without the residual add), rotary
(q and k heads of a fused qkv row, rotated in one call) and silu_and_mul
in bfloat16, with the demo model's shapes (hidden 576, intermediate 1536,
9 query + 3 kv heads of 64), at a decode batch and a prefill chunk's row
counts and for each thread count. Each figure is the median over repeats
of the mean time of ``--calls`` back-to-back calls, through the Python
entry points the model uses (so ctypes and allocation are included).
Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.elementwise import FusedOps
from gpuworkers.engine.models.layers import RMSNorm, RotaryEmbedding

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64


def cases(fused: FusedOps, rows: int, gen: torch.Generator):
    """(name, fused call, torch call) for each op at ``rows`` rows."""
    bf16 = torch.bfloat16
    norm = RMSNorm(HIDDEN, 1e-5).to(bf16)
    x = torch.randn(rows, HIDDEN, generator=gen).to(bf16)
    residual = torch.randn(rows, HIDDEN, generator=gen).to(bf16)
    rotary = RotaryEmbedding(HEAD_DIM, 4096, 10000.0, {}, bf16)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(bf16)
    q = qkv[:, : HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(rows, KV_HEADS, HEAD_DIM)
    both = q.as_strided((rows, HEADS + KV_HEADS, HEAD_DIM), (q.stride(0), HEAD_DIM, 1))
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    gate_up = torch.randn(rows, 2 * INTERMEDIATE, generator=gen).to(bf16)

    def torch_silu():
        gate, up = gate_up.split(INTERMEDIATE, dim=-1)
        return F.silu(gate) * up

    return [
        (
            "rms_norm+residual",
            lambda: fused.rms_norm(x, norm.weight, norm.eps, residual=residual),
            lambda: norm.add_and_norm(residual, x),
        ),
        ("rms_norm", lambda: fused.rms_norm(x, norm.weight, norm.eps), lambda: norm(x)),
        (
            "rotary q+k",
            lambda: fused.rotary_(both, positions, rotary.cos, rotary.sin),
            lambda: rotary(positions, q, k),
        ),
        ("silu_and_mul", lambda: fused.silu_and_mul(gate_up), torch_silu),
    ]


def time_call(call, calls: int, repeats: int) -> float:
    """Median over repeats of the mean seconds per call."""
    for _ in range(3):
        call()
    means = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        means.append((time.perf_counter() - started) / calls)
    return statistics.median(means)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[24, 300])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    lib = build.cpu_library()
    if lib is None:
        print("fused ops unavailable (no compiler, or GPUWORKERS_CPU_KERNELS=0)")
        return
    fused = FusedOps(lib)
    gen = torch.Generator().manual_seed(0)
    print(f"{'op':<18} {'rows':>5} {'threads':>7} {'fused us':>9} {'torch us':>9} {'speedup':>8}")
    with torch.no_grad():
        for rows in args.rows:
            for name, fused_call, torch_call in cases(fused, rows, gen):
                for threads in args.threads:
                    torch.set_num_threads(threads)
                    ours = time_call(fused_call, args.calls, args.repeats)
                    peer = time_call(torch_call, args.calls, args.repeats)
                    print(
                        f"{name:<18} {rows:>5} {threads:>7} {ours * 1e6:>9.1f} "
                        f"{peer * 1e6:>9.1f} {peer / ours:>7.1f}x"
                    )


if __name__ == "__main__":
    main()
