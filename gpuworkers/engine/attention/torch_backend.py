"""Paged attention in plain torch: gather blocks, then one SDPA call.

Decodes of the whole batch share one gather and one masked attention call
per layer; each prefill chunk gets one causal call. The cache layout is
[num_blocks, block_size, kv_heads, head_dim] per layer for K and for V.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpuworkers.engine.attention.metadata import AttentionMetadata


class TorchAttentionBackend:
    name = "torch"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.scale = head_dim**-0.5

    def plan(self, meta: AttentionMetadata, dtype: torch.dtype | None = None) -> None:
        """Nothing to precompute beyond the metadata's index tensors."""

    def forward(
        self,
        q: torch.Tensor,  # [tokens, heads, dim]
        k: torch.Tensor,  # [tokens, kv_heads, dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [blocks, block_size, kv_heads, dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        flat_k = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_v = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        flat_k.index_copy_(0, meta.slot_mapping, k)
        flat_v.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        d = meta.num_decodes
        if d:
            out[:d] = self._decode(q[:d], k_cache, v_cache, meta)
        for span in meta.prefills:
            rows = slice(span.query_start, span.query_start + span.query_len)
            if span.context_len == 0:
                # Nothing cached before this chunk: attend to the fresh K/V.
                out[rows] = self._attend(q[rows], k[rows], v[rows], None, causal=True)
            else:
                keys = k_cache[span.block_table].flatten(0, 1)[: span.kv_len]
                values = v_cache[span.block_table].flatten(0, 1)[: span.kv_len]
                out[rows] = self._attend(q[rows], keys, values, span.mask, causal=False)
        return out

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        tables = meta.decode_block_tables
        batch = tables.shape[0]
        flat_tables = tables.flatten()
        # index_select on the block dimension copies whole blocks (fast);
        # [batch, blocks * block_size, kv_heads, dim] -> [batch, kv_heads, len, dim]
        keys = k_cache.index_select(0, flat_tables).view(batch, -1, self.num_kv_heads, self.head_dim)
        values = v_cache.index_select(0, flat_tables).view(batch, -1, self.num_kv_heads, self.head_dim)
        # CPU SDPA with one query row is several times faster in float32 than
        # in bfloat16 (measured: bench/README.md); the cache stays bfloat16.
        compute = torch.float32 if q.device.type == "cpu" else q.dtype
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2).to(compute),  # [batch, heads, 1, dim]
            keys.transpose(1, 2).to(compute),
            values.transpose(1, 2).to(compute),
            attn_mask=meta.decode_mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.squeeze(2).to(q.dtype)

    def _attend(self, q, k, v, mask, causal: bool) -> torch.Tensor:
        # [len, heads, dim] -> [1, heads, len, dim]
        query = q.transpose(0, 1).unsqueeze(0)
        keys = k.transpose(0, 1).unsqueeze(0)
        values = v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            query,
            keys,
            values,
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.squeeze(0).transpose(0, 1)
