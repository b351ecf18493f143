"""Paged decode attention on CPU with the compiled kernel (paged_decode.cpp)."""

from __future__ import annotations

import torch

from gpuworkers.engine.cpu.pool_kernel import PoolKernel

_DTYPES = {torch.bfloat16: 1, torch.float32: 0}


class PagedDecodeKernel(PoolKernel):
    """Decode attention over the paged pool with the compiled kernel.

    ``supports`` says whether a dtype can use it; callers fall back to the
    gather path otherwise (float16, CUDA tensors, shapes without a kernel).
    """

    def __init__(self, lib, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        super().__init__(lib, num_heads, num_kv_heads, head_dim, block_size)
        self._supported = {
            dtype: bool(lib.paged_decode_supported(flag, head_dim, self.group, block_size))
            for dtype, flag in _DTYPES.items()
        }

    def supports(self, dtype: torch.dtype, device: torch.device) -> bool:
        return device.type == "cpu" and self._supported.get(dtype, False)

    def bind(
        self,
        block_tables: torch.Tensor,
        kv_lens: torch.Tensor,
        table_rows: torch.Tensor | None = None,
    ) -> BoundDecode:
        """This step's query rows, checked once and shared by every layer.

        ``table_rows`` [rows] int64: the block-table row each query row
        reads (default: row i reads table i), so many rows can share one
        sequence's table.
        """
        index = [block_tables, kv_lens] + ([table_rows] if table_rows is not None else [])
        if any(t.dtype != torch.int64 for t in index):
            raise ValueError("block tables, lengths and table rows must be int64")
        if table_rows is not None:
            table_rows = table_rows.contiguous()
        return BoundDecode(self, block_tables.contiguous(), kv_lens.contiguous(), table_rows)

    def __call__(self, q, k_cache, v_cache, block_tables, kv_lens) -> torch.Tensor:
        return self.bind(block_tables, kv_lens)(q, k_cache, v_cache)

    def write_kv(
        self,
        k: torch.Tensor,  # [tokens, kv_heads, dim], rows may be strided
        v: torch.Tensor,
        k_cache: torch.Tensor,  # a layer's keys, [blocks, kv_heads, dim, block_size]
        v_cache: torch.Tensor,  # a layer's values, [blocks, kv_heads, block_size, dim]
        slots: torch.Tensor,  # [tokens] int64, block * block_size + offset
    ) -> None:
        """Store new keys and values at their slots (the cache's layout)."""
        for t in (k, v):
            if t.stride(2) != 1 or t.stride(1) != self.head_dim or t.dtype != k.dtype:
                raise ValueError("k and v rows must hold contiguous heads of one dtype")
        self.lib.write_kv_cache(
            k.element_size(),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            slots.data_ptr(),
            k.shape[0],
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            k_cache.stride(0),
            k_cache.stride(1),
        )


class BoundDecode:
    """The kernel bound to one step's block tables and lengths."""

    __slots__ = ("kernel", "tables", "lens", "rows")

    def __init__(
        self,
        kernel: PagedDecodeKernel,
        tables: torch.Tensor,
        lens: torch.Tensor,
        rows: torch.Tensor | None = None,
    ):
        self.kernel = kernel
        self.tables = tables  # [tables, max_blocks] int64, contiguous
        self.lens = lens  # [seqs] int64: keys of each query row
        self.rows = rows  # [seqs] int64 table row per query row, or None: row i

    def __call__(
        self,
        q: torch.Tensor,  # [seqs, heads, dim]; rows may be strided
        k_cache: torch.Tensor,  # a layer's keys, [blocks, kv_heads, dim, block_size]
        v_cache: torch.Tensor,  # a layer's values, [blocks, kv_heads, block_size, dim]
        out: torch.Tensor | None = None,  # [seqs, heads, dim], contiguous
    ) -> torch.Tensor:
        kernel = self.kernel
        if q.stride(2) != 1 or q.stride(1) != kernel.head_dim:
            q = q.contiguous()
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype)
        elif not out.is_contiguous():
            raise ValueError("out must be contiguous")
        if k_cache.stride()[:2] != v_cache.stride()[:2] or not k_cache[0].is_contiguous():
            raise ValueError("K and V pools must share block and head strides")
        status = kernel.lib.paged_decode(
            _DTYPES[q.dtype],
            q.data_ptr(),
            q.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            self.tables.data_ptr(),
            self.tables.stride(0),
            self.rows.data_ptr() if self.rows is not None else None,
            self.lens.data_ptr(),
            out.data_ptr(),
            q.shape[0],
            kernel.num_heads,
            kernel.num_kv_heads,
            kernel.head_dim,
            kernel.block_size,
            k_cache.stride(0),
            k_cache.stride(1),
            kernel.scale,
        )
        if status:
            raise ValueError("no compiled decode kernel for this shape")
        return out
