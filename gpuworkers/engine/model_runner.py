"""Owns the weights and the KV tensors; runs one forward pass per step.

Reads only the scheduler's ScheduledBatch (a snapshot), never a Sequence.
Every step's tokens (decodes first, then prefill chunks) are flattened into
one batch; the attention backend's metadata builder turns the batch layout
into its index tensors once per step, not per layer. Sampling happens here
too: the step's result is the sampled tokens, which the scheduler needs to
finish the step.
"""

from __future__ import annotations

import torch

from gpuworkers.engine.attention import CommonAttentionMetadata, select_backend
from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.models.config import ModelConfig
from gpuworkers.engine.models.loader import TORCH_DTYPES
from gpuworkers.engine.sampling import StepOutput, prompt_logprobs, sample
from gpuworkers.engine.scheduling.batch import CacheOps, ScheduledBatch


class ModelRunner:
    def __init__(self, config: EngineConfig, model, model_cfg: ModelConfig):
        self.config = config
        self.model = model
        self.model_cfg = model_cfg
        self.device = torch.device(config.device)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.block_size = config.block_size
        backend_cls = select_backend(
            config.attention_backend, config.device, config.deterministic, config.kv_cache_dtype
        )
        options = (
            {"use_kernel": config.cpu_fast_paths, "kv_cache_dtype": config.kv_cache_dtype}
            if backend_cls.name == "torch"
            else {}
        )
        self.backend = backend_cls(
            model_cfg.num_heads,
            model_cfg.num_kv_heads,
            model_cfg.head_dim,
            config.block_size,
            **options,
        )
        # One preallocated pool, [layers, K/V, blocks, *block layout]; the
        # block layout is the backend's. Zeros so padded gathers never read
        # NaNs. An int8 pool keeps each block's scales inside the block
        # (attention/kv_int8.py): swaps and copies below move them along.
        block = self.backend.cache_block_shape()
        cache_dtype = torch.int8 if config.cache_dtype == "int8" else self.dtype
        shape = (model_cfg.num_layers, 2, config.num_kv_blocks, *block)
        self.kv_cache = torch.zeros(shape, dtype=cache_dtype, device=self.device)
        host_shape = (model_cfg.num_layers, 2, config.num_host_blocks, *block)
        self.host_cache = torch.zeros(
            host_shape, dtype=cache_dtype, pin_memory=self.device.type == "cuda"
        )

    # Cache operations -----------------------------------------------------

    def apply_cache_ops(self, ops: CacheOps) -> None:
        """Swaps and copy-on-write copies, before the step's forward pass."""
        if ops.swap_out:
            dev, host = _pairs(ops.swap_out)
            self.host_cache[:, :, host] = self.kv_cache[:, :, dev.to(self.device)].to("cpu")
        if ops.swap_in:
            host, dev = _pairs(ops.swap_in)
            self.kv_cache[:, :, dev.to(self.device)] = self.host_cache[:, :, host].to(self.device)
        if ops.copies:
            src, dst = _pairs(ops.copies)
            self.kv_cache[:, :, dst.to(self.device)] = self.kv_cache[:, :, src.to(self.device)]

    # Forward ------------------------------------------------------------

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Run one step: cache operations, the forward pass, sampling.

        Returns:
            One sampled token per ``batch.samples`` entry, in that order,
            and the prompt logprobs ``batch.prompt_logprobs`` asked for.
        """
        self.apply_cache_ops(batch.cache_ops)
        if not batch.seqs:
            return StepOutput()
        input_ids, positions, logits_indices, meta = self.prepare(batch)
        logits = self.model(input_ids, positions, self.kv_cache, meta, self.backend, logits_indices)
        # Sampling rows first (one per sequence needing logits), then the
        # prompt positions of prompt_logprobs chunks.
        num_rows = logits.shape[0] - sum(len(p.positions) for p in batch.prompt_logprobs)
        out = StepOutput()
        if batch.samples:
            out.sampled = sample(logits[:num_rows], batch.samples)
        if batch.prompt_logprobs:
            out.prompt_logprobs = prompt_logprobs(logits[num_rows:], batch.prompt_logprobs)
        return out

    def prepare(self, batch: ScheduledBatch):
        """Flat input ids, positions and logits rows, and the backend's
        attention metadata, from the batch's per-sequence snapshots."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        starts: list[int] = []  # flat index of each item's first token
        for item in batch.seqs:
            n = len(item.token_ids)
            if item.num_drafts:
                # A verification: logits at every position, one row each.
                logits_indices.extend(range(len(ids), len(ids) + n))
            elif item.needs_logits:
                logits_indices.append(len(ids) + n - 1)
            starts.append(len(ids))
            ids += item.token_ids
            positions += item.positions
            slots += item.slot_mapping
            query_lens.append(n)
            context_lens.append(item.positions.start)
            tables.append(item.block_ids)
        for wanted in batch.prompt_logprobs:
            offset = starts[wanted.index] - batch.seqs[wanted.index].positions.start
            logits_indices.extend(p + offset for p in wanted.positions)
        common = CommonAttentionMetadata(
            num_decodes=batch.num_decodes,
            num_spec=batch.num_verifications,
            slot_mapping=self._tensor(slots),
            query_lens=query_lens,
            context_lens=context_lens,
            block_tables=tables,
            # One request asking is enough: the whole step runs the
            # batch-invariant kernels (its rows share every matmul).
            deterministic=self.config.deterministic or batch.deterministic,
        )
        meta = self.backend.metadata_builder.build(common, self.dtype)
        return self._tensor(ids), self._tensor(positions), self._tensor(logits_indices), meta

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


def _pairs(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = zip(*pairs, strict=True)
    return torch.tensor(first, dtype=torch.long), torch.tensor(second, dtype=torch.long)
