"""Causal prefill attention on CPU with the compiled kernel (prefill_attention.cpp)."""

from __future__ import annotations

import torch

from gpuworkers.engine.cpu.pool_kernel import PoolKernel


class PrefillAttentionKernel(PoolKernel):
    """One sequence's chunk of queries against its keys and values in the pool.

    Query i
    of a chunk of ``q_len`` sees keys [0, kv_len - q_len + i]. bfloat16
    only, and only where the library was built with AVX512_BF16:
    ``supports`` says whether a call can use it; callers keep
    scaled_dot_product_attention otherwise.
    """

    def __init__(self, lib, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        super().__init__(lib, num_heads, num_kv_heads, head_dim, block_size)
        self._supported = bool(lib.prefill_attention_supported(head_dim, self.group, block_size))

    def supports(self, dtype: torch.dtype, device: torch.device) -> bool:
        return self._supported and dtype == torch.bfloat16 and device.type == "cpu"

    def __call__(
        self,
        q: torch.Tensor,  # [q_len, heads, dim]; rows may be strided
        k_cache: torch.Tensor,  # a layer's keys, [blocks, kv_heads, dim, block_size]
        v_cache: torch.Tensor,  # a layer's values, [blocks, kv_heads, block_size, dim]
        block_table: torch.Tensor,  # [>= ceil(kv_len / block_size)] int64
        kv_len: int,
        out: torch.Tensor | None = None,  # [q_len, heads, dim], contiguous
    ) -> torch.Tensor:
        if not all(t.dtype == torch.bfloat16 for t in (q, k_cache, v_cache)):
            raise ValueError("the prefill kernel is bfloat16 only")
        if q.stride(2) != 1 or q.stride(1) != self.head_dim:
            q = q.contiguous()
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype)
        elif not out.is_contiguous():
            raise ValueError("out must be contiguous")
        self.check_pool(k_cache, v_cache)
        if block_table.dtype != torch.int64 or not block_table.is_contiguous():
            raise ValueError("the block table must be contiguous int64")
        if block_table.numel() * self.block_size < kv_len:
            raise ValueError("the block table does not cover kv_len keys")
        status = self.lib.prefill_attention(
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            block_table.data_ptr(),
            q.shape[0],
            kv_len,
            out.data_ptr(),
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            k_cache.stride(0),
            k_cache.stride(1),
            self.scale,
        )
        if status:
            raise ValueError("no compiled prefill kernel for this shape or q_len > kv_len")
        return out
