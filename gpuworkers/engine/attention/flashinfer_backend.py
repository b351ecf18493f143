"""FlashInfer paged attention (CUDA only; the optional ``flashinfer`` extra).

Written against FlashInfer 0.2's wrappers: one BatchDecodeWithPagedKVCache
wrapper for the decode rows and one BatchPrefillWithPagedKVCache wrapper
(causal=True) for the prefill chunks. Both are planned once per step and
run once per layer. The cache layout is FlashInfer's NHD:
[num_blocks, block_size, kv_heads, head_dim] per layer, for K and for V.
"""

from __future__ import annotations

import torch

from gpuworkers.engine.attention.metadata import AttentionMetadata

WORKSPACE_BYTES = 128 << 20


class FlashInferAttentionBackend:
    name = "flashinfer"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        import flashinfer  # imported lazily: an optional extra, CUDA hosts only

        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        self._dtype = None

    def cache_block_shape(self) -> tuple[int, ...]:
        """One block of K (or V) in the pool, NHD: [block_size, kv_heads, head_dim]."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    def plan(self, meta: AttentionMetadata, dtype: torch.dtype | None = None) -> None:
        """Build both wrappers' plans for this step's batch layout."""
        dtype = dtype or self._dtype or torch.bfloat16
        self._dtype = dtype
        device = meta.slot_mapping.device
        if meta.num_decodes:
            lens = meta.decode_kv_lens.tolist()
            tables = meta.decode_block_tables.tolist()
            indptr, indices, last = self._page_table(tables, lens, device)
            self._decode.plan(
                indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim,
                self.block_size, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip
        if meta.prefills:
            qo = [0]
            tables, lens = [], []
            for span in meta.prefills:
                qo.append(qo[-1] + span.query_len)
                tables.append(span.block_table.tolist())
                lens.append(span.kv_len)
            indptr, indices, last = self._page_table(tables, lens, device)
            qo_indptr = torch.tensor(qo, dtype=torch.int32, device=device)
            self._prefill.plan(
                qo_indptr, indptr, indices, last, self.num_heads, self.num_kv_heads,
                self.head_dim, self.block_size, causal=True, q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip

    def _page_table(self, tables, lens, device):
        indptr, indices, last = [0], [], []
        for table, length in zip(tables, lens, strict=True):
            pages = -(-length // self.block_size)
            indices.extend(table[:pages])
            indptr.append(indptr[-1] + pages)
            last.append(length - (pages - 1) * self.block_size)
        as_int = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
        return as_int(indptr), as_int(indices), as_int(last)

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        flat_k = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_k.index_copy_(0, meta.slot_mapping, k)
        flat_v.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        d = meta.num_decodes
        if d:
            out[:d] = self._decode.run(q[:d].contiguous(), (k_cache, v_cache))
        if meta.prefills:
            out[d:] = self._prefill.run(q[d:].contiguous(), (k_cache, v_cache))
        return out
