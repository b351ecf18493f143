"""Index tensors for one step's attention, built once and shared by all layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class PrefillSpan:
    """One sequence's chunk of more than one query token."""

    query_start: int  # offset in the flattened batch
    query_len: int
    context_len: int  # tokens already in the cache before this chunk
    # Device block ids covering context_len + query_len tokens.
    block_table: torch.Tensor
    # Additive float32 causal mask [query_len, context_len + query_len]
    # (0 or -inf) when context_len > 0. Additive, not boolean: CPU SDPA takes
    # a much slower path for boolean masks.
    bias: torch.Tensor | None = None

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
class AttentionMetadata:
    """Layout of the flattened batch: ``num_decodes`` single tokens first,
    then the prefill chunks."""

    num_decodes: int
    # Cache slot (block * block_size + offset) of every token in the batch.
    slot_mapping: torch.Tensor
    # [num_decodes, max_blocks] padded block tables and their valid lengths.
    decode_block_tables: torch.Tensor | None = None
    decode_kv_lens: torch.Tensor | None = None
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillSpan] = field(default_factory=list)
    # Backend-specific state (FlashInfer plans, the bound CPU decode
    # kernel), set by backend.plan().
    backend_state: object | None = None
    # Block and in-block offset of each slot (torch backend without its CPU
    # kernel, which computes them itself), set by plan().
    slot_blocks: torch.Tensor | None = None
    slot_offsets: torch.Tensor | None = None


def additive_mask(valid: torch.Tensor) -> torch.Tensor:
    """A boolean keep-mask as a float32 bias: 0 where kept, -inf elsewhere."""
    bias = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    return bias.masked_fill_(~valid, float("-inf"))
