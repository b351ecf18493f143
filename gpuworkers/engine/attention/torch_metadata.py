"""The torch backend's per-step metadata: index tensors, the decode
groups' padding masks, the bound CPU decode kernel. Built once per step,
shared by every layer.

No mask of query x key size is built here: a chunk after cached context
gets its causal masks per query tile in the backend (``torch_backend``),
at most ``PREFILL_QUERY_TILE`` rows at a time, in the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpuworkers.engine.attention.metadata import CommonAttentionMetadata
from gpuworkers.engine.cpu.paged_decode import BoundDecode, PagedDecodeKernel


@dataclass(slots=True)
class PrefillSpan:
    """One sequence's chunk of more than one query token."""

    query_start: int  # offset in the flattened batch
    query_len: int
    context_len: int  # tokens already in the cache before this chunk
    # Device block ids covering context_len + query_len tokens.
    block_table: torch.Tensor

    @property
    def kv_len(self) -> int:
        return self.context_len + self.query_len


@dataclass(slots=True)
class DecodeGroup:
    """Decode rows [start, end) of similar context length, padded together."""

    start: int
    end: int
    block_tables: torch.Tensor  # [rows, max_blocks]
    # [rows, 1, 1, max_blocks * block_size] float32: 0 on valid keys, -inf on padding.
    bias: torch.Tensor


@dataclass(slots=True)
class TorchAttentionMetadata:
    """Layout of the flattened batch: ``num_decodes`` decode rows first
    (single-token decodes, then each token of the verifications), then
    the prefill chunks.

    In a deterministic step every query token is a "decode" row (its own
    query over the paged cache, ``decode_table_rows`` naming its
    sequence's table) and there are no prefill spans: see ``build``.
    """

    num_decodes: int
    # Cache slot (block * block_size + offset) of every token in the batch.
    slot_mapping: torch.Tensor
    # [num_decodes, max_blocks] int64 padded block tables and [num_decodes]
    # int64 valid lengths (keys per row).
    decode_block_tables: torch.Tensor | None = None
    decode_kv_lens: torch.Tensor | None = None
    # Deterministic steps: [num_decodes] int64, the decode_block_tables row
    # of each query row (rows of one chunk share their sequence's table).
    decode_table_rows: torch.Tensor | None = None
    # The step runs batch-invariant kernels (the model reads this too).
    deterministic: bool = False
    prefills: list[PrefillSpan] = field(default_factory=list)
    # Set by TorchMetadataBuilder.plan, one of the two decode paths: the
    # compiled kernel bound to this step's tables, or padded gather groups.
    decode_kernel: BoundDecode | None = None
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    # Block and in-block offset of each slot, for the torch K/V write
    # (None when the compiled kernel writes K/V: it computes them itself).
    slot_blocks: torch.Tensor | None = None
    slot_offsets: torch.Tensor | None = None


class TorchMetadataBuilder:
    """Builds TorchAttentionMetadata from the runner's common metadata."""

    def __init__(self, block_size: int, kernel: PagedDecodeKernel | None):
        self.block_size = block_size
        self.kernel = kernel

    def build(self, common: CommonAttentionMetadata, dtype: torch.dtype) -> TorchAttentionMetadata:
        """Decode tables and lengths and prefill spans (or, in a
        deterministic step, one query row per token), then ``plan``."""
        device = common.slot_mapping.device
        if common.deterministic:
            meta = self._token_rows(common, device)
            self.plan(meta, dtype)
            return meta
        d = common.num_decodes
        tables = common.block_tables[:d]
        lens = [common.kv_len(i) for i in range(d)]
        for i in range(d, d + common.num_spec):
            # A verification: token j sees the context and itself and the
            # tokens before it, through its sequence's table (the K/V of
            # every token in the step is written before attention).
            for j in range(common.query_lens[i]):
                tables.append(common.block_tables[i])
                lens.append(common.context_lens[i] + j + 1)
        meta = TorchAttentionMetadata(num_decodes=len(lens), slot_mapping=common.slot_mapping)
        if lens:
            meta.decode_block_tables = _long(_pad(tables), device)
            meta.decode_kv_lens = _long(lens, device)
        query_start = len(lens)
        for i in range(d + common.num_spec, common.num_seqs):
            span = PrefillSpan(
                query_start=query_start,
                query_len=common.query_lens[i],
                context_len=common.context_lens[i],
                block_table=_long(common.block_tables[i], device),
            )
            meta.prefills.append(span)
            query_start += span.query_len
        self.plan(meta, dtype)
        return meta

    def _token_rows(self, common: CommonAttentionMetadata, device) -> TorchAttentionMetadata:
        """A deterministic step: every query token, decode or prefill, is
        one row over the paged cache, seeing keys [0, its position].

        The backend writes the step's K/V first, so a token's keys are the
        same cache entries whether they were computed in this chunk, an
        earlier one or another request's (a prefix-cache hit), and every
        row goes through one kernel with one reduction order: its result
        depends on its own query and keys only, not on chunking, cache hits
        or the rest of the batch.
        """
        query_lens = torch.tensor(common.query_lens, dtype=torch.long)
        rows = torch.repeat_interleave(torch.arange(common.num_seqs), query_lens)
        starts = torch.cumsum(query_lens, 0) - query_lens
        offsets = torch.arange(len(rows)) - starts[rows]
        lens = torch.tensor(common.context_lens, dtype=torch.long)[rows] + offsets + 1
        return TorchAttentionMetadata(
            num_decodes=len(rows),
            slot_mapping=common.slot_mapping,
            decode_block_tables=_long(_pad(common.block_tables), device),
            decode_kv_lens=lens.to(device),
            decode_table_rows=rows.to(device),
            deterministic=True,
        )

    def plan(self, meta: TorchAttentionMetadata, dtype: torch.dtype | None = None) -> None:
        """Choose the decode path and precompute it for all layers: bind the
        compiled kernel once, or build the gather path's padded groups; the
        K/V write's slot blocks and offsets where the kernel does not write."""
        meta.decode_groups = []
        meta.decode_kernel = None
        device = meta.slot_mapping.device
        use_kernel = self.kernel is not None and self.kernel.supports(
            dtype or torch.float32, device
        )
        meta.slot_blocks = None if use_kernel else meta.slot_mapping // self.block_size
        meta.slot_offsets = None if use_kernel else meta.slot_mapping % self.block_size
        if not meta.num_decodes:
            return
        if use_kernel:
            meta.decode_kernel = self.kernel.bind(
                meta.decode_block_tables, meta.decode_kv_lens, meta.decode_table_rows
            )
            return
        lens = meta.decode_kv_lens.tolist()
        if meta.decode_table_rows is not None:
            # Deterministic without the kernel: one gather group per row, so
            # that a row's padding and matmul shapes depend on its own length.
            self._single_row_groups(meta, lens, device)
            return
        for start, end in split_decode_groups(lens):
            width = -(-max(lens[start:end]) // self.block_size)
            tables = meta.decode_block_tables[start:end, :width]
            key_pos = torch.arange(width * self.block_size, device=device)
            valid = key_pos[None, :] < meta.decode_kv_lens[start:end, None]
            meta.decode_groups.append(
                DecodeGroup(start, end, tables, additive_mask(valid[:, None, None, :]))
            )

    def _single_row_groups(self, meta: TorchAttentionMetadata, lens: list[int], device) -> None:
        tables = meta.decode_block_tables
        for row, (seq, length) in enumerate(
            zip(meta.decode_table_rows.tolist(), lens, strict=True)
        ):
            width = -(-length // self.block_size)
            key_pos = torch.arange(width * self.block_size, device=device)
            valid = (key_pos < length)[None, None, None, :]
            table = tables[seq : seq + 1, :width]
            meta.decode_groups.append(DecodeGroup(row, row + 1, table, additive_mask(valid)))


def split_decode_groups(lens: list[int], ratio: float = 2.0, min_rows: int = 8):
    """Cut decode rows into runs padded separately (gather path only).

    A new run starts once a row is ``ratio`` times longer than the run's
    first and the run has ``min_rows`` rows: less padding, few extra calls.
    """
    groups, start = [], 0
    for i in range(1, len(lens)):
        if i - start >= min_rows and lens[i] > ratio * lens[start]:
            groups.append((start, i))
            start = i
    groups.append((start, len(lens)))
    return groups


def additive_mask(valid: torch.Tensor) -> torch.Tensor:
    """A boolean keep-mask as a float32 bias: 0 where kept, -inf elsewhere."""
    bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    return bias.masked_fill_(~valid, float("-inf"))


def _pad(tables: list[list[int]]) -> list[list[int]]:
    width = max(len(t) for t in tables)
    return [t + [0] * (width - len(t)) for t in tables]


def _long(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
