"""The int8 KV pool (``kv_cache_dtype="int8"``): its layout, and the torch
reads and writes of it.

Each (token, kv head) of K and of V is quantized on its own, symmetric:
scale = absmax / 127, q = round(x / scale) in [-127, 127]. Per block and kv
head, the int8 data (keys [head_dim, block_size], values [block_size,
head_dim], the torch backend's layout) is followed by ``block_size`` float32
scales, one per token. The scales live inside the block, so everything that
moves blocks (swap in and out, copy-on-write, prefix-cache reuse) moves them
with their data and needs no second pool. For the demo model (head_dim 64)
a token and kv head takes 64 + 4 bytes instead of 128 in bfloat16: 1.88x
the tokens in the same ``kv_cache_bytes``.

The compiled kernels (engine/cpu/paged_decode*.cpp) quantize on write and
dequantize in registers; the helpers here are the plain torch path
(``cpu_fast_paths`` off, no compiler, CUDA) and the prefill path after
cached context, which dequantizes the gathered blocks for SDPA.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # one float32 per token and kv head


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., dim] as int8 [..., dim] and float32 scales [...].

    Rounds half to even, like the compiled write (nearbyintf); a row of
    zeros gets scale 0.
    """
    x = x.float()
    peak = x.abs().amax(dim=-1)
    inv = torch.where(peak > 0, 127.0 / peak, torch.zeros_like(peak))
    quantized = torch.round(x * inv.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return quantized, peak / 127.0


def block_bytes(head_dim: int, block_size: int) -> int:
    """Bytes of one block and kv head: the int8 data and its scales."""
    return head_dim * block_size + SCALE_BYTES * block_size


def split_block(cache: torch.Tensor, head_dim: int, block_size: int):
    """One layer's int8 K (or V) pool [blocks, kv_heads, block_bytes] as
    its data [blocks, kv_heads, head_dim * block_size] int8 and its scales
    [blocks, kv_heads, block_size] float32, both views of the pool."""
    data = head_dim * block_size
    return cache[..., :data], cache[..., data:].view(torch.float32)


def dequantize_keys(keys: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Keys [n, kv_heads, head_dim, block_size] int8 with scales [n,
    kv_heads, block_size], as ``dtype`` (products in float32)."""
    return (keys.float() * scales.unsqueeze(2)).to(dtype)


def dequantize_values(
    values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Values [n, kv_heads, block_size, head_dim] int8 with scales [n,
    kv_heads, block_size], as ``dtype`` (products in float32)."""
    return (values.float() * scales.unsqueeze(3)).to(dtype)
