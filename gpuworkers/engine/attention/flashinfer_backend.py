"""FlashInfer paged attention (CUDA only; the optional ``flashinfer`` extra).

Written against FlashInfer 0.2's wrappers: one BatchDecodeWithPagedKVCache
wrapper for the decode rows and one BatchPrefillWithPagedKVCache wrapper
(causal=True) for the prefill chunks. Both are planned once per step and
run once per layer. The cache layout is FlashInfer's NHD:
[num_blocks, block_size, kv_heads, head_dim] per layer, for K and for V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpuworkers.engine.attention.metadata import CommonAttentionMetadata

WORKSPACE_BYTES = 128 << 20


@dataclass(slots=True)
class FlashInferMetadata:
    """What forward needs besides the wrappers' plans (held by the wrappers)."""

    num_decodes: int  # leading single-token rows, run by the decode wrapper
    num_prefills: int  # prefill chunks after them, run by the prefill wrapper
    slot_mapping: torch.Tensor  # [tokens] int64: where each new K/V goes
    # Batch-invariant linears in the model. FlashInfer's own attention is
    # not made invariant here (its split-KV plan depends on the batch):
    # deterministic serving on CUDA uses attention_backend="torch".
    deterministic: bool = False


class FlashInferMetadataBuilder:
    """Plans both wrappers from the page tables; builds no mask: FlashInfer
    applies causality itself (``causal=True``) from qo_indptr and the
    pages' lengths."""

    def __init__(self, backend: FlashInferAttentionBackend):
        self.backend = backend
        self._dtype = None

    def build(self, common: CommonAttentionMetadata, dtype: torch.dtype) -> FlashInferMetadata:
        """Plan the decode wrapper (decode rows) and the prefill wrapper
        (chunks): indptr, indices, last_page_len and, for prefill, qo_indptr."""
        b = self.backend
        dtype = dtype or self._dtype or torch.bfloat16
        self._dtype = dtype
        device = common.slot_mapping.device
        d = common.num_decodes
        kv_lens = [common.kv_len(i) for i in range(common.num_seqs)]
        if d:
            indptr, indices, last = self._page_table(common.block_tables[:d], kv_lens[:d], device)
            b.decode_wrapper.plan(
                indptr, indices, last, b.num_heads, b.num_kv_heads, b.head_dim,
                b.block_size, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip
        if common.num_prefills:
            qo = [0]
            for query_len in common.query_lens[d:]:
                qo.append(qo[-1] + query_len)
            indptr, indices, last = self._page_table(common.block_tables[d:], kv_lens[d:], device)
            qo_indptr = torch.tensor(qo, dtype=torch.int32, device=device)
            b.prefill_wrapper.plan(
                qo_indptr, indptr, indices, last, b.num_heads, b.num_kv_heads,
                b.head_dim, b.block_size, causal=True, q_data_type=dtype, kv_data_type=dtype,
            )  # fmt: skip
        return FlashInferMetadata(d, common.num_prefills, common.slot_mapping, common.deterministic)

    def _page_table(self, tables, lens, device):
        block_size = self.backend.block_size
        indptr, indices, last = [0], [], []
        for table, length in zip(tables, lens, strict=True):
            pages = -(-length // block_size)
            indices.extend(table[:pages])
            indptr.append(indptr[-1] + pages)
            last.append(length - (pages - 1) * block_size)
        as_int = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
        return as_int(indptr), as_int(indices), as_int(last)


class FlashInferAttentionBackend:
    name = "flashinfer"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        import flashinfer  # imported lazily: an optional extra, CUDA hosts only

        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        # The tensor-core decode kernel pays off once several query heads share
        # a KV head; vLLM's FlashInfer backend switches at a group size above 4
        # (the demo model's is 3: the CUDA-core kernel).
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_tensor_cores=num_heads // num_kv_heads > 4
        )
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD"
        )
        self.metadata_builder = FlashInferMetadataBuilder(self)

    def cache_block_shape(self) -> tuple[int, ...]:
        """One block of K (or V) in the pool, NHD: [block_size, kv_heads, head_dim]."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    def forward(self, q, k, v, k_cache, v_cache, meta: FlashInferMetadata) -> torch.Tensor:
        flat_k = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_k.index_copy_(0, meta.slot_mapping, k)
        flat_v.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        d = meta.num_decodes
        if d:
            out[:d] = self.decode_wrapper.run(q[:d].contiguous(), (k_cache, v_cache))
        if meta.num_prefills:
            out[d:] = self.prefill_wrapper.run(q[d:].contiguous(), (k_cache, v_cache))
        return out
