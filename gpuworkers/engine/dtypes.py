"""The engine's compute dtype, and what ``"auto"`` resolves to on this machine.

bfloat16 halves the bytes every decode step streams, but only where the
hardware computes in it: on CUDA with bfloat16 support, and on CPUs where
oneDNN has a bfloat16 path (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX). On an
AVX2-only CPU (AMD Zen 3, for one) torch falls back to a generic bfloat16
matmul: measured there, a 576x3072 linear took 14 ms at 64 rows against
2.9 ms in float32 (docs/engine.md, "Compute dtype"). ``"auto"`` picks
bfloat16 where it is fast and float32 (CPU) or float16 (older CUDA) where it
is not; an explicit dtype is always kept as asked.
"""

from __future__ import annotations

import functools

import torch

AUTO = "auto"
SUPPORTED = ("float32", "bfloat16", "float16")
# The KV pool's dtype: "auto" stores K/V in the compute dtype; "int8" stores
# them as int8 with a float32 scale per (token, kv head), about 1.9x the
# tokens in the same bytes (attention/kv_int8.py).
KV_CACHE_DTYPES = (AUTO, "int8")


@functools.cache
def cpu_has_fast_bfloat16() -> bool:
    """oneDNN has a bfloat16 matmul path on this CPU."""
    is_supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(torch.backends.mkldnn.is_available() and is_supported and is_supported())


def resolve_dtype(dtype: str, device: str) -> str:
    """The concrete dtype for ``dtype`` (one of SUPPORTED or "auto") on ``device``."""
    if dtype != AUTO:
        if dtype not in SUPPORTED:
            raise ValueError(f"unsupported dtype {dtype!r}; use auto or one of {SUPPORTED}")
        return dtype
    if torch.device(device).type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_fast_bfloat16() else "float32"
