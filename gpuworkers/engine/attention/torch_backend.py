"""Paged attention for CPU (and CUDA without FlashInfer).

Decode rows: on CPU, one call of the compiled paged-decode kernel
(engine/cpu/paged_decode.cpp) reads K/V in place from the pool; where it is not
available (no compiler, float16, CUDA) the rows are gathered into dense
copies, in groups of similar length, for two matmuls. Prefill chunks in
bfloat16 on CPU: one call each of the compiled prefill kernel
(engine/cpu/prefill_attention.cpp), which reads the chunk's and its
context's K/V in place from the pool. Elsewhere (float32, float16, CUDA,
no compiler, a CPU without AVX512_BF16) one scaled_dot_product_attention
call each; a chunk after cached context goes in tiles of
``PREFILL_QUERY_TILE`` queries, each with its own causal mask, so no mask
is ever larger than tile x keys.
Deterministic steps run every token through the decode path (see
``TorchMetadataBuilder._token_rows``). The cache layout is
``cache_block_shape()``: per block and kv head, keys transposed and values
as rows.

With ``kv_cache_dtype="int8"`` the pool holds int8 K/V and a scale per
token after each block's data (attention/kv_int8.py): the compiled decode
kernel and K/V write quantize and dequantize themselves; the gather path
and the prefill path after cached context dequantize the gathered blocks
(the bfloat16 prefill kernel is not used: it reads bfloat16 pools only). A
chunk with no cached context attends to its fresh, unquantized K/V, as
before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpuworkers.engine.attention import kv_int8
from gpuworkers.engine.attention.torch_metadata import (
    DecodeGroup,
    TorchAttentionMetadata,
    TorchMetadataBuilder,
)
from gpuworkers.engine.cpu.build import cpu_library
from gpuworkers.engine.cpu.paged_decode import PagedDecodeKernel
from gpuworkers.engine.cpu.prefill_attention import PrefillAttentionKernel

# Queries per SDPA call for a chunk after cached context. Its mask is
# [tile, keys] in the model's dtype (16 MB in bfloat16 at 32k keys), built
# per tile and layer; one dense [chunk, keys] float32 mask cost 256 MB for
# a 2k chunk on 32k of context. Tiling costs nothing: one layer's
# attention for a 2k chunk on 2k of context in bfloat16 took 136 ms tiled
# vs 160 ms with the dense mask (2 threads, a noisy machine), with
# bit-identical output in that check.
PREFILL_QUERY_TILE = 256


class TorchAttentionBackend:
    name = "torch"

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        use_kernel: bool = True,
        kv_cache_dtype: str = "auto",
    ):
        if kv_cache_dtype not in ("auto", "int8"):
            raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; use 'auto' or 'int8'")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.kv_int8 = kv_cache_dtype == "int8"
        self.scale = head_dim**-0.5
        self.query_tile = PREFILL_QUERY_TILE
        self.kernel: PagedDecodeKernel | None = None
        self.prefill_kernel: PrefillAttentionKernel | None = None
        if use_kernel and (lib := cpu_library()) is not None:
            self.kernel = PagedDecodeKernel(
                lib, num_heads, num_kv_heads, head_dim, block_size, kv_int8=self.kv_int8
            )
            if not self.kv_int8:
                self.prefill_kernel = PrefillAttentionKernel(
                    lib, num_heads, num_kv_heads, head_dim, block_size
                )
        self.metadata_builder = TorchMetadataBuilder(block_size, self.kernel)

    def cache_block_shape(self) -> tuple[int, ...]:
        """One block of K (or V) in the pool: [kv_heads, head_dim * block_size]
        elements, or in an int8 pool [kv_heads, kv_int8.block_bytes()] bytes
        (the data, then a float32 scale per token).

        Per kv head, keys are stored transposed ([head_dim, block_size]) and
        values as rows ([block_size, head_dim]): the decode kernel then needs
        no horizontal sums for q.k (see engine/cpu/paged_decode.cpp).
        """
        if self.kv_int8:
            return (self.num_kv_heads, kv_int8.block_bytes(self.head_dim, self.block_size))
        return (self.num_kv_heads, self.head_dim * self.block_size)

    def _views(self, k_cache: torch.Tensor, v_cache: torch.Tensor):
        """Keys [blocks, kv_heads, dim, block_size] and values [blocks,
        kv_heads, block_size, dim] of one layer's pool (an int8 pool's data,
        without its scales: ``_scales``)."""
        blocks = k_cache.shape[0]
        if self.kv_int8:
            k_cache, _ = kv_int8.split_block(k_cache, self.head_dim, self.block_size)
            v_cache, _ = kv_int8.split_block(v_cache, self.head_dim, self.block_size)
        keys = k_cache.view(blocks, self.num_kv_heads, self.head_dim, self.block_size)
        values = v_cache.view(blocks, self.num_kv_heads, self.block_size, self.head_dim)
        return keys, values

    def _scales(self, k_cache: torch.Tensor, v_cache: torch.Tensor):
        """An int8 pool's key and value scales, [blocks, kv_heads,
        block_size] float32 each; None for a pool in the model dtype."""
        if not self.kv_int8:
            return None
        _, key_scales = kv_int8.split_block(k_cache, self.head_dim, self.block_size)
        _, value_scales = kv_int8.split_block(v_cache, self.head_dim, self.block_size)
        return key_scales, value_scales

    def forward(
        self,
        q: torch.Tensor,  # [tokens, heads, dim]
        k: torch.Tensor,  # [tokens, kv_heads, dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [blocks, *cache_block_shape()]
        v_cache: torch.Tensor,
        meta: TorchAttentionMetadata,
    ) -> torch.Tensor:
        keys, values = self._views(k_cache, v_cache)
        scales = self._scales(k_cache, v_cache)
        if meta.slot_blocks is None:
            self.kernel.write_kv(k, v, keys, values, meta.slot_mapping)
        else:
            self._write(k, v, keys, values, scales, meta)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if meta.decode_kernel is not None:
            d = meta.num_decodes
            meta.decode_kernel(q[:d], keys, values, out=out[:d])
        for group in meta.decode_groups:
            rows = slice(group.start, group.end)
            out[rows] = self._decode(q[rows], keys, values, scales, group)
        prefill_kernel = self.prefill_kernel
        if prefill_kernel is not None and not prefill_kernel.supports(q.dtype, q.device):
            prefill_kernel = None
        for span in meta.prefills:
            rows = slice(span.query_start, span.query_start + span.query_len)
            if prefill_kernel is not None:
                # The chunk's K/V are in the pool (written above), after its context's.
                prefill_kernel(q[rows], keys, values, span.block_table, span.kv_len, out=out[rows])
            elif span.context_len == 0:
                # Nothing cached before this chunk: attend to the fresh K/V.
                out[rows] = self._attend(
                    q[rows], k[rows].transpose(0, 1), v[rows].transpose(0, 1), None, causal=True
                )
            else:
                self._attend_after_context(q[rows], keys, values, scales, span, out[rows])
        return out

    def _write(self, k, v, keys, values, scales, meta: TorchAttentionMetadata) -> None:
        """The torch K/V write (where the compiled one is not used)."""
        blocks, offsets = meta.slot_blocks, meta.slot_offsets
        if scales is not None:
            (k, key_scale), (v, value_scale) = kv_int8.quantize_rows(k), kv_int8.quantize_rows(v)
            scales[0][blocks, :, offsets] = key_scale
            scales[1][blocks, :, offsets] = value_scale
        # Advanced indices around a slice put the token dimension first:
        # both targets are [tokens, kv_heads, dim], like k and v.
        keys[blocks, :, :, offsets] = k
        values[blocks, :, offsets, :] = v

    def _blocks(self, keys, values, scales, flat: torch.Tensor, dtype: torch.dtype):
        """Blocks ``flat`` of the pool as keys [n, kv_heads, dim, block_size]
        and values [n, kv_heads, block_size, dim] in ``dtype``, dequantized
        from an int8 pool."""
        block_keys, block_values = keys.index_select(0, flat), values.index_select(0, flat)
        if scales is None:
            return block_keys, block_values
        key_scales, value_scales = (s.index_select(0, flat) for s in scales)
        return (
            kv_int8.dequantize_keys(block_keys, key_scales, dtype),
            kv_int8.dequantize_values(block_values, value_scales, dtype),
        )

    def _attend_after_context(self, q, keys, values, scales, span, out) -> None:
        """A chunk after ``span.context_len`` cached tokens, in query tiles:
        every query sees the whole context and its own causal past."""
        span_keys, span_values = self._gather(keys, values, scales, span.block_table, q.dtype)
        for start in range(0, span.query_len, self.query_tile):
            end = min(start + self.query_tile, span.query_len)
            visible = span.context_len + end  # keys of the tile's last query
            mask = causal_tail_mask(end - start, visible, q.dtype, q.device)
            out[start:end] = self._attend(
                q[start:end], span_keys[:, :visible], span_values[:, :visible], mask, causal=False
            )

    def _gather(self, keys, values, scales, table: torch.Tensor, dtype: torch.dtype):
        """One sequence's blocks as dense [kv_heads, len, dim] keys and values."""
        heads, dim = self.num_kv_heads, self.head_dim
        block_keys, block_values = self._blocks(keys, values, scales, table, dtype)
        span_keys = block_keys.permute(1, 0, 3, 2).reshape(heads, -1, dim)
        span_values = block_values.transpose(0, 1).reshape(heads, -1, dim)
        return span_keys, span_values

    def _decode(self, q, keys, values, scales, group: DecodeGroup) -> torch.Tensor:
        """The gather path: dense copies of the group's K/V, then two matmuls.

        Used where the compiled kernel is not (no compiler, float16, CUDA
        without FlashInfer). Keys come out as [batch, kv_heads, dim, len],
        ready for q @ K^T.
        """
        tables = group.block_tables
        batch, width = tables.shape
        flat = tables.flatten()
        heads, dim, bs = self.num_kv_heads, self.head_dim, self.block_size
        block_keys, block_values = self._blocks(keys, values, scales, flat, q.dtype)
        keys_t = (
            block_keys.view(batch, width, heads, dim, bs)
            .permute(0, 2, 3, 1, 4)
            .reshape(batch, heads, dim, width * bs)
        )
        dense_values = (
            block_values.view(batch, width, heads, bs, dim)
            .transpose(1, 2)
            .reshape(batch, heads, width * bs, dim)
        )
        per_kv_head = self.num_heads // self.num_kv_heads
        query = q.view(batch, heads, per_kv_head, dim) * self.scale
        # Scores in the model's dtype (float32 accumulation inside the
        # matmul), softmax in float32.
        scores = torch.matmul(query, keys_t).float() + group.bias
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out = torch.matmul(probs, dense_values)
        return out.view(batch, self.num_heads, self.head_dim)

    def _attend(self, q, k, v, mask, causal: bool) -> torch.Tensor:
        # q: [len, heads, dim] -> [1, heads, len, dim]; k, v: [kv_heads, len, dim]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out.squeeze(0).transpose(0, 1)


def causal_tail_mask(rows: int, keys: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive [rows, keys] mask for the last ``rows`` queries over ``keys``
    keys: query r sees keys [0, keys - rows + r]. Additive, not boolean:
    CPU SDPA takes a much slower path for boolean masks."""
    mask = torch.full((rows, keys), float("-inf"), dtype=dtype, device=device)
    return mask.triu_(keys - rows + 1)
