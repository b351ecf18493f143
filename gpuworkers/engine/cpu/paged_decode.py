"""Paged decode attention on CPU with the compiled kernel (paged_decode.cpp)."""

from __future__ import annotations

import torch

from gpuworkers.engine.cpu.pool_kernel import PoolKernel

# The kernel's `kind` bits (paged_decode.h): the query dtype, and an int8 pool.
_DTYPES = {torch.bfloat16: 1, torch.float32: 0}
_KIND_INT8 = 2


class PagedDecodeKernel(PoolKernel):
    """Decode attention over the paged pool with the compiled kernel.

    ``supports`` says whether a dtype can use it; callers fall back to the
    gather path otherwise (float16, CUDA tensors, shapes without a kernel).
    With ``kv_int8`` the pool is int8 with scales (attention/kv_int8.py):
    ``write_kv`` quantizes, the decode dequantizes.
    """

    def __init__(
        self,
        lib,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        kv_int8: bool = False,
    ):
        super().__init__(lib, num_heads, num_kv_heads, head_dim, block_size, kv_int8)
        self.kind_bits = _KIND_INT8 if kv_int8 else 0
        self._supported = {
            dtype: bool(
                lib.paged_decode_supported(flag | self.kind_bits, head_dim, self.group, block_size)
            )
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
        """Store new keys and values at their slots (the cache's layout),
        quantized into an int8 pool."""
        for t in (k, v):
            if t.stride(2) != 1 or t.stride(1) != self.head_dim or t.dtype != k.dtype:
                raise ValueError("k and v rows must hold contiguous heads of one dtype")
        if self.kv_int8 and k.dtype not in _DTYPES:
            raise ValueError("the int8 K/V write takes bfloat16 or float32")
        self.check_pool(k_cache, v_cache)
        write = self.lib.write_kv_cache_int8 if self.kv_int8 else self.lib.write_kv_cache
        write(
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
        kernel.check_pool(k_cache, v_cache)
        status = kernel.lib.paged_decode(
            _DTYPES[q.dtype] | kernel.kind_bits,
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
