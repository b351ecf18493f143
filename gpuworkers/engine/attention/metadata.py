"""What every attention backend gets from the runner, and the interfaces
a backend implements.

The runner flattens a step's tokens (single-token rows first, then prefill
chunks) and describes the batch once in ``CommonAttentionMetadata``; each
backend's ``metadata_builder`` turns that into exactly what its kernels
need, once per step, shared by all layers (vLLM v1's split between
``CommonAttentionMetadata`` and per-backend builders).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(slots=True)
class CommonAttentionMetadata:
    """The step's batch layout, one entry per sequence in batch order."""

    # The first num_decodes sequences have one query token each; the rest
    # are prefill chunks of more than one.
    num_decodes: int
    # [tokens] int64, on the device: cache slot (block * block_size +
    # offset) where each token's new K/V goes.
    slot_mapping: torch.Tensor
    # Query tokens of each sequence this step.
    query_lens: list[int]
    # Tokens of each sequence already in the cache before this step.
    context_lens: list[int]
    # Device blocks of each sequence covering context + query tokens
    # (exactly ceil(kv_len / block_size) of them).
    block_tables: list[list[int]]
    # The num_spec sequences after the decodes verify speculative drafts:
    # a few query tokens after cached context. They are valid prefill
    # chunks (FlashInfer runs them so); the torch backend runs each of
    # their tokens as a decode row with its own key count.
    num_spec: int = 0
    # Run batch-invariant kernels: a token's result must not depend on the
    # chunking, prefix-cache hits or the rest of the batch. Each backend's
    # metadata carries it on as ``deterministic``; the model reads it there
    # for its linear layers.
    deterministic: bool = False

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_prefills(self) -> int:
        return len(self.query_lens) - self.num_decodes

    def kv_len(self, i: int) -> int:
        """Keys sequence ``i`` attends to: its context and its own queries."""
        return self.context_lens[i] + self.query_lens[i]


class AttentionMetadataBuilder(Protocol):
    def build(self, common: CommonAttentionMetadata, dtype: torch.dtype) -> object:
        """This step's backend-specific metadata (plans, index tensors),
        with a ``deterministic`` attribute copied from ``common``."""
        ...


class AttentionBackend(Protocol):
    """Paged attention over the KV pool, one instance per runner."""

    name: str
    # Builds the metadata ``forward`` takes, once per step.
    metadata_builder: AttentionMetadataBuilder

    def cache_block_shape(self) -> tuple[int, ...]:
        """One block of K (or V) in the pool; the runner allocates
        [layers, 2, blocks, *cache_block_shape()]."""
        ...

    def forward(
        self,
        q: torch.Tensor,  # [tokens, heads, dim]
        k: torch.Tensor,  # [tokens, kv_heads, dim]: stored at slot_mapping
        v: torch.Tensor,
        k_cache: torch.Tensor,  # one layer's [blocks, *cache_block_shape()]
        v_cache: torch.Tensor,
        meta: object,  # from metadata_builder.build
    ) -> torch.Tensor:
        """Store k and v in the cache, attend; [tokens, heads, dim]."""
        ...
